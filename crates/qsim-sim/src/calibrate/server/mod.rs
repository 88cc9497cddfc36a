//! Server calibration (`qsim calibrate server`): a server profile's
//! coefficients fitted to serving benchmarks, each coefficient with its
//! 95 % interval, the ones the data do not pin down fixed at a stated
//! value, and what the fitted profile predicts for held-out benchmarks
//! and for saturation. A plain [`Spec`] in, a typed, serde-serialisable
//! [`Calibration`] out ([`run`]); the command line only maps its flags to
//! the spec and renders the result.
//!
//! ```no_run
//! use qsim_sim::calibrate::server::{run, Spec};
//!
//! let mut spec = Spec::new(
//!     "models/llama-3.1-8b-h100-vllm.toml",
//!     vec!["bench-30.json".into(), "bench-60.json".into(), "bench-90.json".into()],
//! );
//! spec.holdout = vec!["bench-75.json".into()];
//! let c = run(&spec)?;
//! for k in &c.coefficients {
//!     println!("{} = {} ({:?}, 95 % {:?})", k.name, k.fit, k.status, k.ci95);
//! }
//! std::fs::write("fitted.toml", &c.fitted_profile)?;
//! println!("{}", serde_json::to_string_pretty(&c)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Input.** The JSON that vLLM's `benchmarks/benchmark_serving.py
//! --save-result` (or `vllm bench serve --save-result`) writes, one file per
//! request rate: `request_rate` (a number, or `"inf"`: every request at
//! once), `completed`, `mean_ttft_ms`, `mean_itl_ms`, `mean_e2el_ms`
//! (`mean_tpot_ms` is read if present), optionally `burstiness` (only 1.0,
//! Poisson arrivals) and `max_concurrency` (only null), and the per-request
//! arrays when the file has them: `input_lens`, `output_lens`, `ttfts`,
//! `itls` and `errors` (a request with an error or no output is left out).
//! Without the arrays the workload is `completed` requests of the mean
//! lengths (`total_input_tokens` / `total_output_tokens` over `completed`).
//! [`read_bench`] reads one file; every bad field is a [`ConfigError`]
//! naming the file and the field.
//!
//! **Model.** A benchmark is replayed in the simulator: its requests (the
//! arrays' lengths, in their order) arrive as a Poisson process at its rate
//! (the first at 0, as the benchmark sends it) on one replica of the
//! profile ([`Cluster`](crate::server::Cluster), the model `qsim serve` and
//! `qsim run` use). The arrival times of the measurement are not in vLLM's
//! file, so each benchmark is simulated [`Spec::reps`] times with different
//! arrival streams (the same streams at every candidate: common random
//! numbers, a smooth objective) and the means are pooled. A file of `qsim
//! calibrate bench` also has `arrival_s`, each request's send time: with
//! [`Spec::recorded_arrivals`] such a benchmark is replayed once, at those
//! times (sorted), so its prediction is of the load the server actually
//! saw, not of the rate's expectation. Simulated TTFT = first token −
//! arrival, E2E = last token − arrival, ITL = Σ(last − first token) /
//! Σ(output − 1) (vLLM's `mean_itl_ms` is the mean of every gap between
//! streamed tokens, the same ratio), TPOT = the mean over requests of
//! (last − first) / (output − 1).
//!
//! **Fit.** The coefficients named by [`Spec::fit`] (dotted paths into the
//! profile TOML; a bare name is under `[iteration]`; default
//! [`DEFAULT_FIT`]) are searched in log space (each as a factor of its
//! base value) by Nelder–Mead, minimising Σ over benchmarks of
//! ln(simulated / observed)² / σ² over mean ITL, E2E and TTFT (with
//! per-request TTFTs: the mean TTFT of the prompts longer than the median
//! and of the others, which tells prefill compute from fixed costs). σ² is
//! the variance of that mean across the simulated arrival streams (one
//! measurement's noise from its arrivals alone, floored at
//! [`MIN_REL_ERR`]), taken at the base profile, then again at the first
//! fit, which is refined with it. A candidate the profile loader refuses
//! (an efficiency above 1) scores +∞. The loader is the profile's own, so
//! the fitter knows no formula. More coefficients than independent
//! observed means is refused ([`check_determined`]).
//!
//! **Intervals: profile likelihood.** The loss is a χ² when the weights
//! are right; it is scaled by the residual variance s² = max(1, loss /
//! (means − coefficients)) when the model fits worse than the arrival noise
//! says (the usual correction; the intervals widen with a worse fit). A
//! coefficient's 95 % interval is the set of its values at which the loss,
//! minimised over the other coefficients, stays within χ²₁(0.95) · s² =
//! 3.84 · s² of its minimum: each side is followed from the fit in five
//! steps up to a factor [`PROFILE_SPAN`] (4), the others refitted at each
//! from the previous point, the crossing bisected twice and interpolated. An end is [`End::Crossed`], [`End::Bound`] (the
//! loader refuses beyond: an efficiency of 1) or [`End::Open`] (still
//! within the threshold a factor of 4 away: the data do not pin the
//! coefficient down on that side). Held-out predictions and the saturation
//! get the envelope of their values over every coefficient set the profiles
//! visited within the threshold (an approximate 95 % band: the profiles
//! explore the directions the data leave loose).
//!
//! **Coefficients the data cannot identify** ([`Unidentified`]): by
//! default ([`Unidentified::Fix`]) a coefficient with an open end is fixed
//! at its base value (the widest first), stated in the result with its
//! interval, and the others are fitted again, until every fitted one is
//! pinned down; [`Unidentified::Warn`] keeps the fit and warns;
//! [`Unidentified::Refuse`] is an error naming the coefficient.
//!
//! **Saturation.** The largest request rate the profile sustains for the
//! benchmarks' length mix: 2,000 requests (the fitted benchmarks' requests,
//! cycled) all waiting at 0, and the completion rate between the 10th and
//! the 90th percentile of completions (the batch full, before the drain).
//!
//! `qsim calibrate bench` measures a live server into such files; its
//! workload (seeded arrivals, lengths and prompt token ids) is
//! [`crate::workload::bench`], its HTTP client `qsim_live::bench`.

pub mod bench;
pub mod coefs;
pub mod fit;
pub mod sim;

pub use bench::{keep_arrivals, read_bench, Bench, Means};
pub use coefs::{fitted_toml, Coefs};
pub use fit::{
    check_determined, data_points, nelder_mead, num, End, Interval, Unidentified, CHI2_1_95,
    MIN_REL_ERR, PROFILE_SPAN,
};
pub use sim::{predict, predict_full, saturation};

use crate::config::{parse_toml, read_toml, ConfigError};
use crate::server::ServerProfile;
use serde::{Serialize, Serializer};
use std::fmt::Write as _;
use std::path::PathBuf;

/// The coefficients fitted when [`Spec::fit`] is `None`: the step-time
/// efficiencies and CPU overheads, and the API server's ingress.
pub const DEFAULT_FIT: &[&str] = &[
    "iteration.bandwidth_efficiency",
    "iteration.compute_efficiency",
    "iteration.cpu_overhead_ms",
    "iteration.cpu_per_seq_us",
    "iteration.ingress_ms",
];

/// A calibration to run.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The base server profile (the coefficients' start values).
    pub profile: PathBuf,
    /// Benchmark files to fit to (one per request rate).
    pub benches: Vec<PathBuf>,
    /// Benchmark files only predicted.
    pub holdout: Vec<PathBuf>,
    /// Coefficients to fit (dotted paths; a bare name is under
    /// `[iteration]`); `None`: [`DEFAULT_FIT`]; empty: none (evaluate the
    /// profile).
    pub fit: Option<Vec<String>>,
    /// The fitted profile's name (default: the base's with "-calibrated").
    pub name: Option<String>,
    /// Simulated arrival streams per benchmark (their means pooled).
    pub reps: u32,
    /// Objective evaluations of the main fit at most.
    pub max_evals: u32,
    /// Seed of the arrival streams.
    pub seed: u64,
    /// Replay a benchmark with `arrival_s` at those times.
    pub recorded_arrivals: bool,
    /// Profile-likelihood intervals (and the identification they allow).
    pub intervals: bool,
    pub unidentified: Unidentified,
}

impl Spec {
    /// The defaults of `qsim calibrate server`: 16 streams, 1,500
    /// evaluations, seed 1, Poisson streams, intervals, unidentified
    /// coefficients fixed.
    pub fn new(profile: impl Into<PathBuf>, benches: Vec<PathBuf>) -> Self {
        Spec {
            profile: profile.into(),
            benches,
            holdout: Vec::new(),
            fit: None,
            name: None,
            reps: 16,
            max_evals: 1500,
            seed: 1,
            recorded_arrivals: false,
            intervals: true,
            unidentified: Unidentified::Fix,
        }
    }
}

/// Fitted or fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Fitted,
    /// Not identified by the benchmarks: fixed at its base value.
    Fixed,
}

/// One coefficient's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Coefficient {
    /// Its dotted path in the profile.
    pub name: String,
    /// The base profile's value (the start, and the value a fixed one keeps).
    pub base: f64,
    /// The fitted (or fixed) value.
    pub fit: f64,
    pub status: Status,
    /// The 95 % profile interval (`None` without intervals).
    pub ci95: Option<[f64; 2]>,
    /// How each end of the interval ended.
    pub ci95_ends: Option<[End; 2]>,
    /// Why a coefficient was fixed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Means in milliseconds (`None`: not defined, e.g. no per-request data).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MeansMs {
    pub ttft_ms: Option<f64>,
    pub itl_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub ttft_long_prompts_ms: Option<f64>,
    pub ttft_short_prompts_ms: Option<f64>,
}

impl From<&Means> for MeansMs {
    fn from(m: &Means) -> Self {
        let ms = |v: f64| v.is_finite().then_some(v * 1e3);
        MeansMs {
            ttft_ms: ms(m.ttft),
            itl_ms: ms(m.itl),
            e2e_ms: ms(m.e2e),
            tpot_ms: ms(m.tpot),
            ttft_long_prompts_ms: ms(m.ttft_long),
            ttft_short_prompts_ms: ms(m.ttft_short),
        }
    }
}

/// A band of means.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MeansBand {
    pub lo: MeansMs,
    pub hi: MeansMs,
}

/// A request rate: a number, or `"inf"` (every request at once).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(pub f64);

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_finite() {
            s.serialize_f64(self.0)
        } else {
            s.serialize_str("inf")
        }
    }
}

/// One benchmark's observed means and the predictions.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub file: String,
    pub request_rate: Rate,
    /// Successful requests replayed.
    pub requests: usize,
    /// "recorded" (replayed at `arrival_s`) or "poisson".
    pub arrivals: &'static str,
    pub observed: MeansMs,
    pub fitted: MeansMs,
    pub base: MeansMs,
    /// Held out, with intervals: the envelope of the predictions over the
    /// coefficient sets within the profiles' threshold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fitted_ci95: Option<MeansBand>,
}

/// The profile's saturation rate (requests/s) for the fitted benchmarks'
/// length mix.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Saturation {
    pub fitted: f64,
    pub base: f64,
    pub ci95: Option<[f64; 2]>,
}

/// How the intervals were made.
#[derive(Debug, Clone, Serialize)]
pub struct IntervalMethod {
    /// "profile likelihood" or "none".
    pub method: &'static str,
    /// The loss's rise that bounds an interval (χ²₁ 95 % × `residual_scale`).
    pub threshold: f64,
    /// s² = max(1, loss / (means − fitted coefficients)).
    pub residual_scale: f64,
    /// Independent observed means fitted to.
    pub means: usize,
    /// How far each profile was followed, as a factor either way.
    pub span: f64,
}

/// The outcome of [`run`].
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// The base profile's file.
    pub profile: String,
    pub coefficients: Vec<Coefficient>,
    /// The loss at the fit (Σ ln(sim/obs)²/σ²).
    pub objective: f64,
    pub evaluations: u32,
    pub reps: u32,
    pub intervals: IntervalMethod,
    pub fit: Vec<BenchResult>,
    pub holdout: Vec<BenchResult>,
    pub saturation_rps: Saturation,
    /// Said on stderr by the command line: coefficients fixed or not
    /// pinned down, a fit without residual degrees of freedom.
    pub warnings: Vec<String>,
    /// The fitted profile's TOML: the base file's text with the fitted
    /// values written in place and a header saying where they come from.
    #[serde(skip)]
    pub fitted_profile: String,
}

/// Run a calibration: read the profile and the benchmark files, fit,
/// profile each coefficient, predict. Errors name the file and field (or
/// the coefficient) and nothing is written.
pub fn run(spec: &Spec) -> Result<Calibration, ConfigError> {
    let base_file = spec.profile.display().to_string();
    let base = read_toml(&spec.profile)?;
    let (names, from_flag): (Vec<String>, bool) = match &spec.fit {
        None => (DEFAULT_FIT.iter().map(|s| s.to_string()).collect(), false),
        Some(v) => {
            if v.iter().any(|n| n.trim().is_empty()) {
                return Err(bench::field_err(
                    "--fit",
                    "--fit",
                    "an empty coefficient name",
                ));
            }
            (v.iter().map(|n| n.trim().to_string()).collect(), true)
        }
    };
    if spec.reps == 0 {
        return Err(bench::field_err("--reps", "--reps", "must be at least 1"));
    }
    let coefs = Coefs::new(&base_file, base, &names)?;
    let read = |p: &PathBuf| read_bench(p).map(|b| keep_arrivals(b, spec.recorded_arrivals));
    let fit = spec
        .benches
        .iter()
        .map(read)
        .collect::<Result<Vec<_>, _>>()?;
    if fit.is_empty() {
        return Err(bench::field_err(
            "BENCH_JSON",
            "",
            "no benchmark file to fit to",
        ));
    }
    let holdout = spec
        .holdout
        .iter()
        .map(read)
        .collect::<Result<Vec<_>, _>>()?;
    check_determined(&coefs.names, from_flag, &fit)?;
    let pr = fit::Problem {
        coefs,
        fit,
        holdout,
        reps: spec.reps,
        seed: spec.seed,
    };
    let out = pr.run(spec.max_evals, spec.intervals, spec.unidentified)?;
    let values = pr.to_values(&out.solved.x);
    let zero = vec![0.0; pr.n()];
    let base_p = pr.profile_at(&zero)?;
    let fitted_p = pr.profile_at(&out.solved.x)?;
    let ho = pr.fit.len() as u64;
    let pool = pr.pool();
    let base_fit = pr.predict_all(&base_p, &pr.fit, 0);
    let fitted_fit = pr.predict_all(&fitted_p, &pr.fit, 0);
    let base_ho = pr.predict_all(&base_p, &pr.holdout, ho);
    let fitted_ho = pr.predict_all(&fitted_p, &pr.holdout, ho);
    let sat = saturation(&fitted_p, &pool);
    // the envelope over the plausible coefficient sets
    let mut bands: Vec<Option<(Means, Means)>> = vec![None; pr.holdout.len()];
    let mut sat_band: Option<(f64, f64)> = None;
    if spec.intervals && !out.plausible.is_empty() {
        for x in &out.plausible {
            let p = pr.profile_at(x)?;
            for (h, m) in pr.predict_all(&p, &pr.holdout, ho).into_iter().enumerate() {
                bands[h] = Some(match bands[h] {
                    None => (m, m),
                    Some((lo, hi)) => (means_zip(&lo, &m, f64::min), means_zip(&hi, &m, f64::max)),
                });
            }
            let s = saturation(&p, &pool);
            sat_band = Some(match sat_band {
                None => (s, s),
                Some((a, b)) => (a.min(s), b.max(s)),
            });
        }
    }
    let bench_result =
        |b: &Bench, base: &Means, f: &Means, band: Option<(Means, Means)>| BenchResult {
            file: b.file.clone(),
            request_rate: Rate(b.rate),
            requests: b.reqs.len(),
            arrivals: if b.arrivals.is_some() {
                "recorded"
            } else {
                "poisson"
            },
            observed: (&b.observed).into(),
            fitted: f.into(),
            base: base.into(),
            fitted_ci95: band.map(|(lo, hi)| MeansBand {
                lo: (&lo).into(),
                hi: (&hi).into(),
            }),
        };
    let coefficients: Vec<Coefficient> = pr
        .coefs
        .names
        .iter()
        .enumerate()
        .map(|(k, n)| Coefficient {
            name: n.clone(),
            base: pr.coefs.start[k],
            fit: values[k],
            status: if out.free[k] {
                Status::Fitted
            } else {
                Status::Fixed
            },
            ci95: out.intervals[k].map(|iv| [iv.lo, iv.hi]),
            ci95_ends: out.intervals[k].map(|iv| [iv.lo_end, iv.hi_end]),
            note: out.fixed_why[k].clone(),
        })
        .collect();
    let means: usize = pr.fit.iter().map(data_points).sum();
    let mut c = Calibration {
        profile: base_file.clone(),
        objective: out.solved.loss,
        evaluations: out.solved.evals,
        reps: spec.reps,
        intervals: IntervalMethod {
            method: if spec.intervals {
                "profile likelihood"
            } else {
                "none"
            },
            threshold: out.threshold,
            residual_scale: out.scale,
            means,
            span: PROFILE_SPAN,
        },
        fit: pr
            .fit
            .iter()
            .enumerate()
            .map(|(i, b)| bench_result(b, &base_fit[i], &fitted_fit[i], None))
            .collect(),
        holdout: pr
            .holdout
            .iter()
            .enumerate()
            .map(|(i, b)| bench_result(b, &base_ho[i], &fitted_ho[i], bands[i]))
            .collect(),
        saturation_rps: Saturation {
            fitted: sat,
            base: saturation(&base_p, &pool),
            ci95: sat_band.map(|(a, b)| [a.min(sat), b.max(sat)]),
        },
        warnings: out.warnings,
        coefficients,
        fitted_profile: String::new(),
    };
    c.fitted_profile = fitted_profile(spec, &pr, &c)?;
    Ok(c)
}

fn means_zip(a: &Means, b: &Means, f: fn(f64, f64) -> f64) -> Means {
    Means {
        ttft: f(a.ttft, b.ttft),
        itl: f(a.itl, b.itl),
        e2e: f(a.e2e, b.e2e),
        tpot: f(a.tpot, b.tpot),
        ttft_long: f(a.ttft_long, b.ttft_long),
        ttft_short: f(a.ttft_short, b.ttft_short),
    }
}

/// The fitted profile's text, checked by the profile loader.
fn fitted_profile(spec: &Spec, pr: &fit::Problem, c: &Calibration) -> Result<String, ConfigError> {
    let base_file = &c.profile;
    let base_name = pr
        .coefs
        .base
        .get("name")
        .and_then(|n| n.as_str())
        .unwrap_or("server")
        .to_string();
    let name = spec
        .name
        .clone()
        .unwrap_or(format!("{base_name}-calibrated"));
    let text = crate::input::read_text(&spec.profile, crate::input::Kind::Config)
        .map_err(|e| bench::field_err(base_file, "", e))?;
    let files: Vec<String> = pr.fit.iter().map(|b| b.file.clone()).collect();
    let mut comment = format!(
        "Fitted by `qsim calibrate server --profile {base_file}` to {}.\nObjective Σ ln(sim/obs)²/σ² over mean TTFT, ITL, E2E: {:.5}; saturation {} req/s.",
        files.join(", "),
        c.objective,
        num(c.saturation_rps.fitted)
    );
    for k in &c.coefficients {
        let iv = k
            .ci95
            .map(|[a, b]| format!(" (95 % {}–{})", num(a), num(b)))
            .unwrap_or_default();
        let what = match k.status {
            Status::Fitted => "",
            Status::Fixed => " fixed, not identified",
        };
        let _ = write!(
            comment,
            "\n{}: base {} → {}{iv}{what}",
            k.name,
            num(k.base),
            num(k.fit)
        );
    }
    let values: Vec<f64> = c.coefficients.iter().map(|k| k.fit).collect();
    let toml = fitted_toml(&text, &pr.coefs.names, &values, &name, &comment);
    let v = parse_toml("fitted profile", &toml)?;
    ServerProfile::from_value("fitted profile", v)?;
    Ok(toml)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Benchmarks whose observed means are a known profile's own
    /// predictions (Poisson streams, the seed the fit uses), in a fresh
    /// directory: (dir, truth profile path, bench paths).
    fn synthetic(tag: &str, cpu_ms: f64) -> (PathBuf, PathBuf, Vec<PathBuf>) {
        let dir = std::env::temp_dir().join(format!("qsim-calibrate-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let text = std::fs::read_to_string(root.join("models/llama-cpp-tiny-cpu.toml")).unwrap();
        assert!(text.contains("\ncpu_overhead_ms = 0.5\n"));
        let truth = dir.join("truth.toml");
        std::fs::write(
            &truth,
            text.replace(
                "\ncpu_overhead_ms = 0.5\n",
                &format!("\ncpu_overhead_ms = {cpu_ms}\n"),
            ),
        )
        .unwrap();
        let base = dir.join("base.toml");
        std::fs::write(&base, &text).unwrap();
        let p = Arc::new(crate::server::load_profile(&truth).unwrap());
        let mut files = Vec::new();
        for (k, rate) in [1.0, 3.0, 6.0].into_iter().enumerate() {
            let lens: Vec<(u32, u32)> = (0..60u32)
                .map(|i| (64 + (i * 37) % 128, 16 + (i * 13) % 32))
                .collect();
            let ins: Vec<u32> = lens.iter().map(|l| l.0).collect();
            let outs: Vec<u32> = lens.iter().map(|l| l.1).collect();
            let mut b = Bench {
                file: String::new(),
                rate,
                reqs: lens.clone(),
                observed: Means {
                    ttft: 1.0,
                    itl: 1.0,
                    e2e: 1.0,
                    tpot: f64::NAN,
                    ttft_long: f64::NAN,
                    ttft_short: f64::NAN,
                },
                split: 0,
                per_request: None,
                arrivals: None,
            };
            b.split = {
                let mut s = ins.clone();
                s.sort_unstable();
                s[(s.len() - 1) / 2]
            };
            let m = predict(&p, &b, k as u64, 4, 1);
            let f = dir.join(format!("b{k}.json"));
            std::fs::write(
                &f,
                serde_json::json!({"request_rate": rate, "completed": 60,
                    "mean_ttft_ms": m.ttft * 1e3, "mean_itl_ms": m.itl * 1e3, "mean_e2el_ms": m.e2e * 1e3,
                    "input_lens": ins, "output_lens": outs})
                .to_string(),
            )
            .unwrap();
            files.push(f);
        }
        (dir, base, files)
    }

    fn spec(base: &std::path::Path, files: Vec<PathBuf>, fit: &[&str]) -> Spec {
        let mut s = Spec::new(base, files);
        s.fit = Some(fit.iter().map(|x| x.to_string()).collect());
        s.reps = 4;
        s.max_evals = 300;
        s
    }

    /// A coefficient the benchmarks move is recovered, with an interval
    /// around the truth; one they cannot see (`weights_gib`: with an
    /// explicit KV block count it sizes nothing the replay runs) is fixed
    /// at its base value, stated; `warn` keeps it and says so; `refuse`
    /// names it.
    #[test]
    fn unidentified_coefficients_are_fixed_warned_or_refused() {
        let (dir, base, files) = synthetic("ident", 3.0);
        let names = ["iteration.cpu_overhead_ms", "iteration.weights_gib"];
        let c = run(&spec(&base, files.clone(), &names)).unwrap();
        let (cpu, w) = (&c.coefficients[0], &c.coefficients[1]);
        assert_eq!(cpu.status, Status::Fitted, "{c:?}");
        assert!((cpu.fit / 3.0 - 1.0).abs() < 0.05, "{cpu:?}");
        let [lo, hi] = cpu.ci95.unwrap();
        assert!(lo < 3.0 && 3.0 < hi && hi / lo < 3.0, "{cpu:?}");
        assert_eq!(cpu.ci95_ends, Some([End::Crossed, End::Crossed]));
        assert_eq!(w.status, Status::Fixed, "{c:?}");
        assert_eq!(w.fit, w.base);
        assert!(
            w.note.as_deref().unwrap().contains("not pinned down"),
            "{w:?}"
        );
        assert!(c
            .warnings
            .iter()
            .any(|x| x.contains("iteration.weights_gib: fixed")));
        assert!(c
            .fitted_profile
            .contains("weights_gib = 0.085000  # fitted"));
        let mut s = spec(&base, files.clone(), &names);
        s.unidentified = Unidentified::Warn;
        let c = run(&s).unwrap();
        assert_eq!(c.coefficients[1].status, Status::Fitted);
        assert_eq!(c.coefficients[1].ci95_ends.unwrap(), [End::Open, End::Open]);
        assert!(c
            .warnings
            .iter()
            .any(|x| x.contains("iteration.weights_gib: not pinned down")));
        s.unidentified = Unidentified::Refuse;
        let e = run(&s).unwrap_err().to_string();
        assert!(
            e.contains("iteration.weights_gib") && e.contains("not pinned down"),
            "{e}"
        );
        // the JSON is the typed result's
        let v = serde_json::to_value(run(&spec(&base, files, &names[..1])).unwrap()).unwrap();
        assert_eq!(v["coefficients"][0]["status"], "fitted");
        assert_eq!(v["intervals"]["method"], "profile likelihood");
        assert!(v.get("fitted_profile").is_none());
        let _ = std::fs::remove_dir_all(dir);
    }
}
