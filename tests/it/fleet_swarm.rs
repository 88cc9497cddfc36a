//! Seeded swarm over fleets (issue 39): random pools (profiles, replicas,
//! routers, models, length thresholds, prefix caches), random routers
//! between pools and random workloads (with shared system prompts and
//! multi-turn sessions), with invariants checked from outside the
//! simulation: every request goes to a pool that serves its model and
//! length (the first such pool under `first`), or to none when no pool
//! does; every routed request leaves exactly once, from the pool and
//! replica it went to; no KV cache is ever over its capacity, counting the
//! cached blocks kept in free space; a request's prefix hits never exceed
//! the blocks its replica can have cached (the longest run of its leading
//! blocks that requests sent to that replica before it, or itself, carried);
//! a lazy run equals the step-by-step one. A failure names its seed; rerun
//! one with `QSIM_SWARM_SEED=<seed>`.

use qsim_core::route::{Policy, Scorers, Spill};
use qsim_sim::engine::rng::{stream, unit, Rng};
use qsim_sim::engine::RawDist;
use qsim_sim::fleet::run::{run_observed, Observer, RunOpts};
use qsim_sim::fleet::workload::{Arrival, Len, Source, Synthetic, Workload};
use qsim_sim::fleet::{Fleet, FleetCompletion, FleetSpec, PoolSpec, PrefillLink, Role};
use qsim_sim::server::{Completion, ServerProfile};
use qsim_sim::time::{secs, Nanos};
use qsim_sim::workload::{ArrivalProcess, Lengths, RawArrivals};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

fn pick(rng: &mut Rng, lo: u64, hi: u64) -> u64 {
    lo + (unit(rng) * (hi - lo + 1) as f64) as u64
}

fn random_profile(rng: &mut Rng) -> ServerProfile {
    let block = [1, 4, 16, 32][pick(rng, 0, 3) as usize];
    let max_model_len = pick(rng, 64, 3000);
    let min_blocks = max_model_len.div_ceil(block);
    let total_blocks = pick(rng, min_blocks, min_blocks * 3);
    let seqs = pick(rng, 1, 64);
    let text = format!(
        r#"
kind = "server"
name = "swarm"
[scheduler]
max_num_seqs = {seqs}
max_batched_tokens = {}
chunked_prefill = {}
max_model_len = {max_model_len}
[kv_cache]
block_size = {block}
total_blocks = {total_blocks}
kv_bytes_per_token = 1000
[iteration]
hbm_bandwidth_tb_s = 1
peak_tflops = 100
weights_gib = {}
active_params_b = 1
cpu_overhead_ms = {}
ingress_ms = {}
"#,
        seqs + pick(rng, 0, 2048),
        unit(rng) < 0.7,
        0.5 + unit(rng) * 2.0,
        unit(rng),
        if unit(rng) < 0.5 {
            0.0
        } else {
            unit(rng) * 3.0
        },
    );
    let v = qsim_sim::config::parse_toml("swarm", &text).unwrap();
    ServerProfile::from_value("swarm", v).unwrap()
}

fn random_policy(rng: &mut Rng, targets: usize, pools: bool) -> Policy {
    match pick(rng, 0, if pools { 6 } else { 5 }) {
        0 => Policy::RoundRobin,
        1 => Policy::LeastOutstanding,
        2 => Policy::LeastKv,
        3 => Policy::Spill(Spill {
            max_waiting: Some(pick(rng, 1, 6)),
            max_kv: (unit(rng) < 0.5).then(|| 0.3 + 0.7 * unit(rng)),
        }),
        4 => Policy::Scored(Scorers {
            queue: unit(rng),
            kv: unit(rng),
            prefix: unit(rng),
        }),
        5 => Policy::Weighted((0..targets).map(|_| pick(rng, 1, 5)).collect()),
        _ => Policy::First,
    }
}

/// A random fleet and workload.
fn random_case(seed: u64) -> (FleetSpec, Workload, Nanos) {
    let mut rng = stream(seed, 39, 1);
    let unit_tokens = 32 * pick(&mut rng, 1, 4) as u32;
    let synthetic = (unit(&mut rng) < 0.6).then(|| {
        let sys = unit(&mut rng) < 0.7;
        let sessions = if sys && unit(&mut rng) < 0.4 {
            0
        } else {
            pick(&mut rng, 1, 40) as u32
        };
        Synthetic {
            unit: unit_tokens,
            system_prompts: if sys { pick(&mut rng, 1, 6) as u32 } else { 1 },
            system_tokens: if sys {
                pick(&mut rng, 1, 600) as u32
            } else {
                0
            },
            sessions,
            turns: 1.0 + 6.0 * unit(&mut rng),
            max_prompt: pick(&mut rng, 200, 2500) as u32,
        }
    });
    let nmodels = pick(&mut rng, 1, 3) as usize;
    let npools = pick(&mut rng, 1, 5) as usize;
    let mut pools = Vec::new();
    for i in 0..npools {
        let prof = Arc::new(random_profile(&mut rng));
        let replicas = if i == 0 {
            pick(&mut rng, 1, 4)
        } else {
            pick(&mut rng, 0, 4)
        } as u32;
        let models: Vec<u16> = (0..nmodels as u16)
            .filter(|_| unit(&mut rng) < 0.6)
            .collect();
        let models = if models.is_empty() {
            vec![pick(&mut rng, 0, nmodels as u64 - 1) as u16]
        } else {
            models
        };
        let max_tokens =
            (unit(&mut rng) < 0.5).then(|| pick(&mut rng, 2, prof.max_model_len as u64));
        pools.push(PoolSpec {
            name: format!("p{i}"),
            profile_label: "swarm".into(),
            policy: random_policy(&mut rng, replicas.max(1) as usize, false),
            profile: prof,
            replicas,
            autoscale: None,
            models,
            max_tokens,
            min_tokens: None,
            replica_hour_usd: 1.0,
            prefix_cache: unit(&mut rng) < 0.7,
            role: Role::Serve,
        });
    }
    // prefill/decode: the last pool prefills for some of the others
    if npools >= 2 && unit(&mut rng) < 0.4 {
        let pf = npools - 1;
        pools[pf].role = Role::Prefill;
        pools[pf].replicas = pools[pf].replicas.max(1);
        #[allow(clippy::needless_range_loop)] // the prefill pool's index is pf
        for p in 0..pf {
            if unit(&mut rng) < 0.7 {
                pools[p].role = Role::Decode(PrefillLink {
                    pool: pf as u16,
                    bytes_per_s: 10f64.powf(8.0 + 3.0 * unit(&mut rng)),
                    local_max: if unit(&mut rng) < 0.5 {
                        0
                    } else {
                        pick(&mut rng, 1, 600) as u32
                    },
                });
            }
        }
    }
    let route = random_policy(&mut rng, npools, true);
    let spec = FleetSpec {
        models: (0..nmodels).map(|m| format!("m{m}")).collect(),
        pools,
        route,
        prefix_unit: synthetic.as_ref().map(|s| s.unit),
    };
    let len = Lengths::from_raw(
        "swarm",
        "",
        &RawDist::Lognormal {
            p50: 40.0 + 400.0 * unit(&mut rng),
            p95: 1500.0,
            min: Some(1.0),
            max: Some(2500.0),
        },
        &RawDist::Lognormal {
            p50: 10.0 + 100.0 * unit(&mut rng),
            p95: 400.0,
            min: Some(1.0),
            max: Some(600.0),
        },
    )
    .unwrap();
    let mut acc = 0.0;
    let shares: Vec<f64> = (0..nmodels).map(|_| 0.2 + unit(&mut rng)).collect();
    let total: f64 = shares.iter().sum();
    let mut mix: Vec<(u16, f64)> = shares
        .iter()
        .enumerate()
        .map(|(m, s)| {
            acc += s / total;
            (m as u16, acc)
        })
        .collect();
    mix.last_mut().unwrap().1 = 1.0;
    let rate = 2.0 + 60.0 * unit(&mut rng);
    let w = Workload {
        source: Source::Open {
            process: ArrivalProcess::new(&RawArrivals::Poisson, rate).unwrap(),
            len: Len::Dists(len),
            prefix: synthetic,
        },
        mix,
    };
    (spec, w, secs(20.0 + 40.0 * unit(&mut rng)))
}

/// The checker: what the spec alone says.
struct Check<'a> {
    spec: &'a FleetSpec,
    /// Requests in flight: id → (pool, replica, leading full blocks, input,
    /// arrival).
    inside: BTreeMap<u64, (usize, u32, Vec<u64>, u32, Nanos)>,
    /// Per (pool, replica): every block hash a request sent there carried.
    seen: BTreeMap<(usize, u32), HashSet<u64>>,
    hits: u64,
    last_id: Option<u64>,
    routed: u64,
    unrouted: u64,
    done: Vec<(u16, Completion)>,
    kv_checks: u64,
}

impl Check<'_> {
    fn eligible(&self, a: &Arrival, p: usize) -> bool {
        let ps = &self.spec.pools[p];
        ps.replicas > 0
            && ps.role != Role::Prefill
            && ps.models.contains(&a.model)
            && ps
                .max_tokens
                .is_none_or(|m| (a.input + a.output) as u64 <= m)
    }
}

impl Observer for Check<'_> {
    fn routed(&mut self, id: u64, a: &Arrival, hashes: &[u64], to: Option<(usize, u32)>) {
        let pool = to.map(|t| t.0);
        assert!(self.last_id.is_none_or(|l| id > l), "ids increase");
        self.last_id = Some(id);
        let eligible: Vec<usize> = (0..self.spec.pools.len())
            .filter(|&p| self.eligible(a, p))
            .collect();
        match pool {
            None => {
                assert!(
                    eligible.is_empty(),
                    "request {id} unrouted though pools {eligible:?} serve it"
                );
                self.unrouted += 1;
            }
            Some(p) => {
                assert!(
                    eligible.contains(&p),
                    "request {id} ({a:?}) sent to pool {p}, which does not serve it"
                );
                if self.spec.route == Policy::First {
                    assert_eq!(p, eligible[0], "first: the first pool serving it");
                }
                let r = to.unwrap().1;
                let full = match self.spec.prefix_unit {
                    Some(u) => hashes[..hashes.len().min((a.input / u) as usize)].to_vec(),
                    None => Vec::new(),
                };
                self.seen
                    .entry((p, r))
                    .or_default()
                    .extend(full.iter().copied());
                assert!(
                    self.inside
                        .insert(id, (p, r, full, a.input, a.at))
                        .is_none(),
                    "request {id} routed twice"
                );
                self.routed += 1;
            }
        }
    }
    fn completed(&mut self, c: &FleetCompletion) {
        let id = c.c.id;
        match self.inside.remove(&id) {
            Some((p, r, full, input, at)) => {
                assert_eq!(p, c.pool as usize, "request {id} left from another pool");
                assert_eq!(
                    at, c.c.arrival,
                    "request {id}: its arrival, as it reached the fleet"
                );
                assert_eq!(r, c.c.replica, "request {id} left from another replica");
                let cached = c.c.cached_tokens;
                let ps = &self.spec.pools[p];
                match self.spec.prefix_unit {
                    Some(u) if ps.prefix_cache => {
                        let seen = &self.seen[&(p, r)];
                        let run = full.iter().take_while(|h| seen.contains(h)).count() as u32;
                        assert!(
                            cached.is_multiple_of(u) && cached <= run * u,
                            "request {id}: {cached} cached tokens, at most {run} blocks of {u} could be"
                        );
                        assert!(
                            cached < input,
                            "request {id}: one prompt token at least is computed"
                        );
                        self.hits += (cached > 0) as u64;
                    }
                    _ => assert_eq!(cached, 0, "request {id}: hits without a prefix cache"),
                }
            }
            None => panic!("request {id} left but was not inside (lost or duplicated)"),
        }
        self.done.push((c.pool, c.c));
    }
    fn steps(&self) -> bool {
        true
    }
    fn step(&mut self, _now: Nanos, f: &Fleet) {
        for (p, ps) in self.spec.pools.iter().enumerate() {
            let c = f.cluster(p);
            for r in 0..c.replica_count() {
                let (_, evictable) = c.prefix_cached(r);
                assert!(
                    c.kv_blocks_in_use(r) as u64 + evictable <= ps.profile.total_blocks as u64,
                    "pool {p} replica {r}: KV over capacity"
                );
                self.kv_checks += 1;
            }
        }
    }
}

fn seeds() -> Vec<u64> {
    match std::env::var("QSIM_SWARM_SEED") {
        Ok(s) => vec![s.parse().expect("QSIM_SWARM_SEED is a number")],
        Err(_) => (0..60).collect(),
    }
}

#[test]
fn fleet_swarm_invariants() {
    let mut totals = (0u64, 0u64, 0u64, 0u64);
    let (mut remote, mut local) = (0u64, 0u64);
    for seed in seeds() {
        let (spec, w, dur) = random_case(seed);
        let mut ck = Check {
            spec: &spec,
            seen: BTreeMap::new(),
            hits: 0,
            inside: BTreeMap::new(),
            last_id: None,
            routed: 0,
            unrouted: 0,
            done: Vec::new(),
            kv_checks: 0,
        };
        let opts = RunOpts {
            lazy: false,
            ..RunOpts::new(dur)
        };
        let r = run_observed(&spec, &w, opts, seed, &mut ck)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(
            ck.inside.is_empty(),
            "seed {seed}: {} requests never left",
            ck.inside.len()
        );
        assert_eq!(ck.routed + ck.unrouted, r.arrivals, "seed {seed}");
        assert_eq!(ck.unrouted, r.unrouted, "seed {seed}");
        let per_pool: u64 = r.pools.iter().map(|p| p.routed).sum();
        assert_eq!(per_pool, ck.routed, "seed {seed}");
        assert!(ck.kv_checks > 0);
        // the lazy run (when the routers allow it) leaves the same requests
        // at the same times in the same order
        let mut lazy = Check {
            spec: &spec,
            seen: BTreeMap::new(),
            hits: 0,
            inside: BTreeMap::new(),
            last_id: None,
            routed: 0,
            unrouted: 0,
            done: Vec::new(),
            kv_checks: 0,
        };
        struct NoSteps<'a, 'b>(&'a mut Check<'b>);
        impl Observer for NoSteps<'_, '_> {
            fn routed(&mut self, id: u64, a: &Arrival, h: &[u64], to: Option<(usize, u32)>) {
                self.0.routed(id, a, h, to)
            }
            fn completed(&mut self, c: &FleetCompletion) {
                self.0.completed(c)
            }
        }
        run_observed(&spec, &w, RunOpts::new(dur), seed, &mut NoSteps(&mut lazy)).unwrap();
        assert!(lazy.done == ck.done, "seed {seed}: the lazy run differs");
        totals.0 += ck.routed;
        totals.1 += ck.unrouted;
        totals.2 += r.pools.iter().map(|p| p.metrics.preemptions).sum::<u64>();
        totals.3 += ck.hits;
        remote += r.disagg.remote;
        local += r.disagg.local;
        // every prompt prefilled remotely moves its KV, unless the prefill
        // pool rejected it (it then leaves its decode pool rejected)
        let rejected = ck
            .done
            .iter()
            .filter(|(p, c)| c.rejected && matches!(spec.pools[*p as usize].role, Role::Decode(_)))
            .count() as u64;
        let d = r.disagg;
        assert!(
            d.transfers <= d.remote && d.transfers + rejected >= d.remote,
            "seed {seed}: {d:?}"
        );
        let decoded: u64 = r
            .pools
            .iter()
            .zip(&spec.pools)
            .filter(|(_, ps)| matches!(ps.role, Role::Decode(_)))
            .map(|(p, _)| p.routed)
            .sum();
        assert_eq!(
            d.remote + d.local,
            decoded,
            "seed {seed}: every decode pool's request prefilled once"
        );
    }
    if seeds().len() > 1 {
        // the swarm covers routed and unrouted requests and preemption
        assert!(
            totals.0 > 10_000 && totals.1 > 100 && totals.2 > 100 && totals.3 > 1000,
            "{totals:?}"
        );
        // and prefill/decode disaggregation, both ways
        assert!(remote > 1000 && local > 100, "{remote} {local}");
    }
}
