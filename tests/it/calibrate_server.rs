//! Server calibration round trip (issue 12, item 4b): `qsim serve` of the
//! Llama-3.1-8B vLLM profile with coefficients the fitter never reads
//! (bandwidth efficiency × 0.85, compute efficiency × 0.8, CPU overhead
//! per iteration and per sequence × 1.4), measured by `qsim calibrate bench` (an open-loop
//! streaming client in the manner of vLLM's benchmark_serving.py, writing
//! its result JSON) at 30, 60 and 90 % of the truth's saturation rate and
//! at 75 % held out, 500 requests each, time scale 1; then `qsim calibrate
//! server` from the unperturbed profile on the three JSON files alone.
//! Checks: the fitted profile predicts the held-out benchmark's mean TTFT,
//! ITL and E2E within 10 % of what was measured, and the saturation rate
//! within 10 % of the truth's (the simulator's saturation of the served
//! profile for the same length mix). 127.0.0.1 only; ≈ 100 s of
//! measurement + ≈ 60 s of fitting.
//!
//! Plus bad input: a benchmark file with a missing, mistyped or unsupported
//! field, or a bad `--fit` → exit 2 naming the file and the field, no
//! output file.

use crate::common::serve as serve_helpers;

use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BASE: &str = "models/llama-3.1-8b-h100-vllm.toml";

use serve_helpers::qsim;

fn truth_profile(dir: &Path) -> String {
    let base = std::fs::read_to_string(format!("{ROOT}/{BASE}")).unwrap();
    let t = base
        .replace(
            "bandwidth_efficiency = 0.74\n",
            "bandwidth_efficiency = 0.629\n",
        )
        .replace("cpu_overhead_ms = 0.8\n", "cpu_overhead_ms = 1.12\n")
        .replace(
            "compute_efficiency = 0.83\n",
            "compute_efficiency = 0.664\n",
        )
        .replace("cpu_per_seq_us = 7.5\n", "cpu_per_seq_us = 10.5\n");
    assert!(
        t.contains("= 0.629\n")
            && t.contains("= 0.664\n")
            && t.contains("= 1.12\n")
            && t.contains("= 10.5\n"),
        "profile edit failed"
    );
    let p = dir.join("truth.toml");
    std::fs::write(&p, t).unwrap();
    p.to_str().unwrap().to_string()
}

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

const INPUT: &str = "64..1024";
const OUTPUT: &str = "16..256";

#[test]
fn calibrate_server_predicts_a_held_out_rate_and_saturation() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let truth = truth_profile(dir.path());
    // The truth's saturation for this length mix, to place the rates: a
    // file with the lengths only (its means are not used by --fit none).
    let probe = d("probe.json");
    let lens: Vec<(u32, u32)> = (0..400u32)
        .map(|k| (64 + (k * 617) % 961, 16 + (k * 131) % 241))
        .collect();
    std::fs::write(
        &probe,
        serde_json::json!({"request_rate": 1.0, "completed": lens.len(), "mean_ttft_ms": 1.0,
            "mean_itl_ms": 1.0, "mean_e2el_ms": 1.0,
            "input_lens": lens.iter().map(|l| l.0).collect::<Vec<_>>(),
            "output_lens": lens.iter().map(|l| l.1).collect::<Vec<_>>()})
        .to_string(),
    )
    .unwrap();
    let (code, out, err) = qsim(
        &[
            "calibrate",
            "server",
            "--profile",
            &truth,
            "--fit",
            "none",
            &probe,
            "--reps",
            "1",
            "--format",
            "json",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{err}");
    let sat0 = json(&out)["saturation_rps"]["fitted"].as_f64().unwrap();
    assert!(sat0 > 5.0 && sat0 < 500.0, "{sat0}");

    // Measured in real time (scale 1); a run whose held-out check fails is
    // repeated once with the server at half speed (scale 0.5: the machine's
    // scheduling delays count half as much in model time), so that a loaded
    // machine's stalls, not the fit, cannot decide the verdict; the second
    // run's verdict stands.
    let mut scale = 1.0;
    let (fit, files, fitted, _kept) = loop {
        let dir = tempfile::tempdir().unwrap();
        let d = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
        let (_serve, url) = serve_helpers::serve(Path::new(&truth), scale, 1);
        let fracs = [0.3, 0.6, 0.9, 0.75];
        let mut files = Vec::new();
        for (k, f) in fracs.iter().enumerate() {
            let rate = format!("{:.2}", f * sat0);
            let file = d(&format!("bench{k}.json"));
            let (code, out, err) = qsim(
                &[
                    "calibrate",
                    "bench",
                    "--target",
                    &url,
                    "--rate",
                    &rate,
                    "--requests",
                    "500",
                    "--input-len",
                    INPUT,
                    "--output-len",
                    OUTPUT,
                    "--seed",
                    &(k + 11).to_string(),
                    "--out",
                    &file,
                    "--time-scale",
                    &scale.to_string(),
                ],
                Duration::from_secs(600),
            );
            assert_eq!(code, 0, "{err}");
            eprintln!("{}", out.trim());
            let v = json(&std::fs::read_to_string(&file).unwrap());
            assert_eq!(v["completed"].as_u64(), Some(500), "{out}");
            files.push(file);
        }
        let fitted = d("fitted.toml");
        let (code, out, err) = qsim(
            &[
                "calibrate",
                "server",
                "--profile",
                BASE,
                &files[0],
                &files[1],
                &files[2],
                "--holdout",
                &files[3],
                "--format",
                "json",
                "--out",
                &fitted,
            ],
            Duration::from_secs(900),
        );
        assert_eq!(code, 0, "{err}");
        let fit = json(&out);
        eprintln!(
            "{}",
            serde_json::to_string_pretty(&fit["coefficients"]).unwrap()
        );
        let ho = &fit["holdout"][0];
        let mut off = Vec::new();
        for m in ["ttft_ms", "itl_ms", "e2e_ms"] {
            let (o, p) = (
                ho["observed"][m].as_f64().unwrap(),
                ho["fitted"][m].as_f64().unwrap(),
            );
            let b = ho["base"][m].as_f64().unwrap();
            eprintln!(
                "scale {scale}: held out {m}: observed {o:.3}, fitted {p:.3} ({:+.1} %), base {b:.3} ({:+.1} %)",
                (p / o - 1.0) * 100.0,
                (b / o - 1.0) * 100.0
            );
            if (p / o - 1.0).abs() > 0.10 {
                off.push(format!("held-out {m}: predicted {p}, measured {o}"));
            }
        }
        if off.is_empty() {
            // keep the files (read again below) for the rest of the test
            break (fit, files, fitted, dir);
        }
        assert!(scale < 1.0, "at half speed too: {}", off.join("; "));
        eprintln!("repeated at half speed: {}", off.join("; "));
        scale = 0.5;
    };
    let ho = &fit["holdout"][0];
    // The truth's saturation for the fitted benchmarks' length mix.
    let (code, out, err) = qsim(
        &[
            "calibrate",
            "server",
            "--profile",
            &truth,
            "--fit",
            "none",
            &files[0],
            &files[1],
            &files[2],
            "--format",
            "json",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(code, 0, "{err}");
    let sat_true = json(&out)["saturation_rps"]["fitted"].as_f64().unwrap();
    let sat = fit["saturation_rps"]["fitted"].as_f64().unwrap();
    let sat_base = fit["saturation_rps"]["base"].as_f64().unwrap();
    eprintln!("saturation: truth {sat_true:.2}, fitted {sat:.2} ({:+.1} %), base {sat_base:.2} ({:+.1} %), ci {}",
        (sat / sat_true - 1.0) * 100.0, (sat_base / sat_true - 1.0) * 100.0, fit["saturation_rps"]["ci95"]);
    assert!(
        (sat / sat_true - 1.0).abs() <= 0.10,
        "saturation {sat} vs truth {sat_true}"
    );
    // The check has teeth: the unfitted profile misses the truth by more.
    assert!(
        (sat_base / sat_true - 1.0).abs() > 0.10,
        "base {sat_base} vs truth {sat_true}"
    );
    for m in ["ttft_ms", "itl_ms", "e2e_ms"] {
        let (o, b) = (
            ho["observed"][m].as_f64().unwrap(),
            ho["base"][m].as_f64().unwrap(),
        );
        assert!(
            (b / o - 1.0).abs() > 0.10,
            "the base already predicts {m}: {b} vs {o}"
        );
    }
    // The written profile is a server profile with the fitted values.
    let text = std::fs::read_to_string(&fitted).unwrap();
    assert!(
        text.starts_with("# Fitted by `qsim calibrate server"),
        "{text}"
    );
    let v: toml::Value = toml::from_str(&text).unwrap();
    let be = fit["coefficients"][0]["fit"].as_f64().unwrap();
    assert_eq!(
        fit["coefficients"][0]["name"],
        "iteration.bandwidth_efficiency"
    );
    let got = v["iteration"]["bandwidth_efficiency"].as_float().unwrap();
    assert!((got - be).abs() < 1e-5, "{got} vs {be}");
    let (code, _, err) = qsim(
        &[
            "calibrate",
            "server",
            "--profile",
            &fitted,
            "--fit",
            "none",
            &files[3],
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{err}");
    // Deterministic: the same inputs give the same bytes.
    let args = [
        "calibrate",
        "server",
        "--profile",
        BASE,
        &files[0],
        &files[1],
        "--reps",
        "2",
        "--max-evals",
        "40",
        "--format",
        "json",
    ];
    let a = qsim(&args, Duration::from_secs(120));
    let b = qsim(&args, Duration::from_secs(120));
    assert_eq!(a.0, 0, "{}", a.2);
    assert_eq!(a.1, b.1);
}

fn good_bench() -> Value {
    serde_json::json!({
        "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": null, "completed": 3,
        "mean_ttft_ms": 30.0, "mean_itl_ms": 12.0, "mean_e2el_ms": 800.0, "mean_tpot_ms": 12.0,
        "total_input_tokens": 1500, "total_output_tokens": 180,
        "input_lens": [400, 500, 600], "output_lens": [50, 60, 70],
        "ttfts": [0.03, 0.03, 0.03], "itls": [[0.012, 0.012], [0.012], [0.012]],
        "errors": ["", "", ""]
    })
}

#[test]
fn bad_benchmark_files_exit_2_naming_the_field() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fitted.toml");
    let case = |name: &str, edit: &dyn Fn(&mut Value), text: Option<&str>, want: &str| {
        let mut v = good_bench();
        edit(&mut v);
        let f = dir.path().join(format!("{name}.json"));
        std::fs::write(
            &f,
            text.map(str::to_string).unwrap_or_else(|| v.to_string()),
        )
        .unwrap();
        let fs = f.to_str().unwrap();
        let (code, stdout, err) = qsim(
            &[
                "calibrate",
                "server",
                "--profile",
                BASE,
                fs,
                "--reps",
                "1",
                "--max-evals",
                "5",
                "--intervals",
                "none",
                "--out",
                out.to_str().unwrap(),
            ],
            Duration::from_secs(60),
        );
        assert_eq!(code, 2, "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(
            err.starts_with(&format!("qsim: {fs}: {want}")),
            "{name}: {err}"
        );
        assert!(stdout.is_empty() && !out.exists(), "{name}");
    };
    case(
        "good-but-unparsable",
        &|_| {},
        Some("{\"request_rate\": "),
        "not JSON",
    );
    case(
        "missing-itl",
        &|v| {
            v.as_object_mut().unwrap().remove("mean_itl_ms");
        },
        None,
        "mean_itl_ms: missing",
    );
    case(
        "rate-text",
        &|v| v["request_rate"] = "fast".into(),
        None,
        "request_rate: must be a rate",
    );
    case(
        "rate-zero",
        &|v| v["request_rate"] = 0.into(),
        None,
        "request_rate: must be a rate",
    );
    case(
        "gamma",
        &|v| v["burstiness"] = 0.5.into(),
        None,
        "burstiness: only 1.0",
    );
    case(
        "capped",
        &|v| v["max_concurrency"] = 8.into(),
        None,
        "max_concurrency:",
    );
    case(
        "short-outputs",
        &|v| v["output_lens"] = serde_json::json!([50, 60]),
        None,
        "output_lens: has 2 items",
    );
    case(
        "bad-len",
        &|v| v["input_lens"][1] = (-5).into(),
        None,
        "input_lens.1: must be a token count",
    );
    case(
        "bad-itl",
        &|v| v["itls"][0][1] = "x".into(),
        None,
        "itls.0.1: must be seconds",
    );
    case(
        "no-ttft",
        &|v| v["mean_ttft_ms"] = 0.into(),
        None,
        "mean_ttft_ms: must be > 0",
    );
    case(
        "short-arrivals",
        &|v| v["arrival_s"] = serde_json::json!([0.0, 0.5]),
        None,
        "arrival_s: has 2 items",
    );
    case(
        "bad-arrival",
        &|v| v["arrival_s"] = serde_json::json!([0.0, -1.0, 0.5]),
        None,
        "arrival_s.1: must be seconds",
    );
    case(
        "all-failed",
        &|v| v["errors"] = serde_json::json!(["boom", "boom", "boom"]),
        None,
        "output_lens: no successful request",
    );
    // a bad --fit: exit 2 naming it
    let f = dir.path().join("ok.json");
    std::fs::write(&f, good_bench().to_string()).unwrap();
    for (fit, want) in [
        ("warp_factor", "iteration.warp_factor: absent"),
        (
            "scheduler.max_num_seqs",
            "--fit: --fit: scheduler.max_num_seqs: not a fittable real coefficient",
        ),
    ] {
        let (code, _, err) = qsim(
            &[
                "calibrate",
                "server",
                "--profile",
                BASE,
                f.to_str().unwrap(),
                "--fit",
                fit,
            ],
            Duration::from_secs(60),
        );
        assert_eq!(code, 2, "{fit}: {err}");
        assert!(err.contains(want), "{fit}: {err}");
    }
}

/// A benchmark with recorded send times (`arrival_s`, as `qsim calibrate
/// bench` writes) is replayed at those times, not as Poisson streams at
/// its rate: every request recorded at 0 predicts exactly what a burst
/// (rate "inf") of the same requests predicts, and not what Poisson
/// arrivals at its stated rate predict; the order of the array does not
/// matter (the requests are sorted by their times). Opt-in
/// (`--recorded-arrivals`).
#[test]
fn recorded_arrivals_are_replayed_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let predict = |name: &str, v: &Value| -> Value {
        let f = dir.path().join(format!("{name}.json"));
        std::fs::write(&f, v.to_string()).unwrap();
        let (code, out, err) = qsim(
            &[
                "calibrate",
                "server",
                "--profile",
                BASE,
                "--fit",
                "none",
                f.to_str().unwrap(),
                "--reps",
                "4",
                "--format",
                "json",
                "--recorded-arrivals",
            ],
            Duration::from_secs(60),
        );
        assert_eq!(code, 0, "{name}: {err}");
        let j = json(&out);
        j["fit"][0].clone()
    };
    let mut at0 = good_bench();
    at0["arrival_s"] = serde_json::json!([0.0, 0.0, 0.0]);
    let mut burst = good_bench();
    burst["request_rate"] = "inf".into();
    let (a, b, p) = (
        predict("at0", &at0),
        predict("burst", &burst),
        predict("poisson", &good_bench()),
    );
    assert_eq!(a["arrivals"], "recorded");
    assert_eq!(p["arrivals"], "poisson");
    assert_eq!(a["fitted"], b["fitted"], "{a}\n{b}");
    assert_ne!(a["fitted"]["ttft_ms"], p["fitted"]["ttft_ms"], "{a}\n{p}");
    // spread out and listed out of order: the same as listed in order
    let mut spread = good_bench();
    spread["arrival_s"] = serde_json::json!([0.0, 2.0, 4.0]);
    let mut shuffled = good_bench();
    shuffled["arrival_s"] = serde_json::json!([2.0, 4.0, 0.0]);
    for k in ["input_lens", "output_lens", "ttfts", "itls"] {
        let x = spread[k].as_array().unwrap().clone();
        shuffled[k] = serde_json::json!([x[1], x[2], x[0]]);
    }
    let (s1, s2) = (predict("spread", &spread), predict("shuffled", &shuffled));
    assert_eq!(s1["fitted"], s2["fitted"], "{s1}\n{s2}");
    assert_eq!(s1["observed"], s2["observed"], "{s1}\n{s2}");
    assert_ne!(s1["fitted"]["ttft_ms"], a["fitted"]["ttft_ms"]);
}

/// Issue 26, item 6: out-of-range inputs are refused naming the file and
/// field (a rate of 1e308 was accepted), and a fit with fewer independent
/// observed means than coefficients is refused (five coefficients were
/// fitted to one file silently). No live dependencies: files only.
#[test]
fn out_of_range_benchmarks_and_underdetermined_fits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = |v: &Value, name: &str, extra: &[&str]| {
        let f = dir.path().join(format!("{name}.json"));
        std::fs::write(&f, v.to_string()).unwrap();
        let fs = f.to_str().unwrap().to_string();
        let mut a = vec!["calibrate", "server", "--profile", BASE, &fs];
        a.extend_from_slice(&["--reps", "1", "--max-evals", "5", "--intervals", "none"]);
        a.extend_from_slice(extra);
        let (code, out, err) = qsim(&a, Duration::from_secs(120));
        (code, out, err, fs)
    };
    let mut no_arrays = good_bench();
    for k in ["input_lens", "output_lens", "ttfts", "itls", "errors"] {
        no_arrays.as_object_mut().unwrap().remove(k);
    }
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "rate",
            {
                let mut v = good_bench();
                v["request_rate"] = 1e308.into();
                v
            },
            "request_rate: must be a rate > 0 and at most 100000 requests/s",
        ),
        (
            "completed",
            {
                let mut v = no_arrays.clone();
                v["completed"] = 1e15.into();
                v
            },
            "completed: must be a count from 1 to 1000000",
        ),
        (
            "ttft",
            {
                let mut v = good_bench();
                v["mean_ttft_ms"] = 1e300.into();
                v
            },
            "mean_ttft_ms: ",
        ),
        (
            "tokens",
            {
                let mut v = no_arrays.clone();
                v["total_input_tokens"] = 1e300.into();
                v
            },
            "total_input_tokens: ",
        ),
        (
            "req-ttft",
            {
                let mut v = good_bench();
                v["ttfts"][1] = 1e9.into();
                v
            },
            "ttfts.1: ",
        ),
    ];
    for (name, v, want) in cases {
        let (code, out, err, fs) = run(&v, name, &["--fit", "compute_efficiency"]);
        assert_eq!((code, out.as_str()), (2, ""), "{name}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
        assert!(
            err.starts_with(&format!("qsim: {fs}: {want}")),
            "{name}: {err}"
        );
    }
    // one file with per-request arrays: 4 independent means < 5 coefficients
    let (code, _, err, _) = run(&good_bench(), "one", &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.starts_with(
            "qsim: --fit: 5 coefficients (the default --fit) to fit to 4 independent observed means (1 benchmark file(s)"
        ),
        "{err}"
    );
    // without the arrays: 3
    let (code, _, err, _) = run(
        &no_arrays,
        "one-means",
        &[
            "--fit",
            "compute_efficiency,bandwidth_efficiency,cpu_overhead_ms,ingress_ms",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.starts_with("qsim: --fit: 4 coefficients to fit to 3 independent"),
        "{err}"
    );
    // a coefficient the files cannot see (the reserved memory sizes a KV
    // cache these three requests never fill): fixed at its base value and
    // said, or refused by name
    let f = dir.path().join("unseen.json");
    std::fs::write(&f, good_bench().to_string()).unwrap();
    let fs = f.to_str().unwrap();
    let unseen = |policy: &str| {
        qsim(
            &[
                "calibrate",
                "server",
                "--profile",
                BASE,
                fs,
                "--reps",
                "1",
                "--fit",
                "kv_cache.reserved_gib,iteration.bandwidth_efficiency",
                "--unidentified",
                policy,
                "--format",
                "json",
            ],
            Duration::from_secs(120),
        )
    };
    let (code, out, err) = unseen("fix");
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["coefficients"][0]["status"], "fixed", "{out}");
    assert_eq!(v["coefficients"][0]["fit"], v["coefficients"][0]["base"]);
    assert!(
        err.contains("kv_cache.reserved_gib: fixed at its base value"),
        "{err}"
    );
    let (code, out, err) = unseen("refuse");
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("qsim: --fit: kv_cache.reserved_gib: not pinned down by these benchmarks"),
        "{err}"
    );
    // as many coefficients as means: fitted
    let (code, _, err, _) = run(
        &no_arrays,
        "one-ok",
        &[
            "--fit",
            "compute_efficiency,bandwidth_efficiency,cpu_overhead_ms",
        ],
    );
    assert_eq!(code, 0, "{err}");
}
