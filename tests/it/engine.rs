//! A real engine in the loop (issue 24): llama.cpp's `llama-server`, built
//! by `scripts/llama-deps.sh` from the source the `llama-cpp-python` sdist
//! vendors, serving a random-weight 4-layer Llama GGUF
//! (`scripts/llama-model.py`) on 127.0.0.1 with one thread.
//!
//! Engine timing is real time on a shared CPU, so these tests are
//! `#[ignore]`d in a plain `cargo test` (listed as ignored, with the
//! reason) and `scripts/test.sh` runs them on their own afterwards, one at
//! a time (`-- --ignored engine:: --test-threads=1`), when nothing else of
//! the suite competes for the cores.

use crate::common::{free_port, qsim, Proc};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A running `llama-server`.
pub struct Engine {
    pub url: String,
    _proc: Proc,
}

/// Start llama.cpp's server: `threads` CPU threads, `slots` parallel
/// sequences (continuous batching), `ctx` KV tokens in one buffer shared
/// by the slots (`-kvu`, llama-server's default when it picks the slot
/// count itself; see [`measured_profile`] for why it matters), prompt
/// caching on (its default), metrics on.
/// Returns once `/health` answers 200.
pub fn start(threads: u32, slots: u32, ctx: u32) -> Engine {
    let (_, model) = crate::common::llama_paths();
    start_at(&model, free_port(), threads, slots, ctx)
}

/// [`start`] with another model file, on a given port (a restarted engine
/// is found at the same address).
pub fn start_at(model: &std::path::Path, port: u16, threads: u32, slots: u32, ctx: u32) -> Engine {
    let (server, _) = crate::common::llama_paths();
    let log = std::env::temp_dir().join(format!("qsim-llama-{port}.log"));
    let child = Command::new(&server)
        .args(["-m", &model.display().to_string()])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-t", &threads.to_string(), "-tb", &threads.to_string()])
        .args(["-np", &slots.to_string(), "-c", &ctx.to_string(), "-kvu"])
        .args(["--metrics", "--no-webui", "--seed", "1"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("engine log"))
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", server.display()));
    let mut p = Proc(child);
    let url = format!("http://127.0.0.1:{port}");
    let t = Instant::now();
    loop {
        if let Some(s) = p.0.try_wait().unwrap() {
            panic!(
                "llama-server exited ({s}) before it was healthy: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if get(&url, "/health").0 == 200 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "llama-server not healthy within 120 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Engine { url, _proc: p }
}

/// GET on a fresh connection: (status, body); (0, "") when nothing answers.
pub fn get(url: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let hostport = url.strip_prefix("http://").unwrap();
    let Ok(mut s) = std::net::TcpStream::connect(hostport) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {hostport}\r\nconnection: close\r\n\r\n"
    );
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

/// POST JSON, non-streaming: the answer's JSON.
pub fn post(url: &str, path: &str, body: &Value) -> Value {
    let (status, _, text) = crate::common::http(
        url,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{path}: {text}");
    let text = if text.contains("\r\n") && !text.trim_start().starts_with('{') {
        crate::common::dechunk(&text)
    } else {
        text
    };
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"))
}

/// A Prometheus counter or gauge of the engine's `/metrics`.
pub fn metric(url: &str, name: &str) -> f64 {
    let (status, body) = get(url, "/metrics");
    assert_eq!(status, 200, "/metrics: {body}");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no {name} in /metrics: {body}"))
}

#[test]
#[ignore = "real engine timing: scripts/test.sh runs it alone (-- --ignored engine::)"]
fn engine_answers_with_exactly_max_tokens() {
    crate::live!(Engine);
    let e = start(1, 4, 4096);
    for (n, max) in [(16u32, 37u32), (300, 1), (5, 64)] {
        let prompt: Vec<u32> = (0..n).map(|j| 1000 + 7 * j).collect();
        let v = post(
            &e.url,
            "/v1/completions",
            &json!({"model": "m", "prompt": prompt, "max_tokens": max, "temperature": 0.0}),
        );
        assert_eq!(v["usage"]["completion_tokens"], max, "{v}");
        assert_eq!(v["usage"]["prompt_tokens"], n, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    }
    // chat, sampled at the default temperature: still never an end of sequence
    let v = post(
        &e.url,
        "/v1/chat/completions",
        &json!({"model": "m", "max_tokens": 9,
            "messages": [{"role": "user", "content": "how long is a piece of string"}]}),
    );
    assert_eq!(v["usage"]["completion_tokens"], 9, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
}

#[test]
#[ignore = "real engine timing: scripts/test.sh runs it alone (-- --ignored engine::)"]
fn calibrate_bench_prompts_miss_the_prefix_cache_and_no_request_is_lost() {
    crate::live!(Engine);
    // two slots, so one keep-alive connection carries most of the 150
    // requests: llama-server closes a connection after 100 requests
    let e = start(1, 2, 2048);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench.json");
    let (n, input, output) = (150u64, 24u64, 3u64);
    let before = metric(&e.url, "llamacpp:prompt_tokens_total");
    let o = qsim()
        .args(["calibrate", "bench", "--target", &e.url, "--rate", "40"])
        .args([
            "--requests",
            &n.to_string(),
            "--input-len",
            &input.to_string(),
        ])
        .args([
            "--output-len",
            &output.to_string(),
            "--token-ids",
            "300..31999",
        ])
        .args(["--seed", "3", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let errors: Vec<String> = serde_json::from_value(r["errors"].clone()).unwrap();
    assert!(errors.iter().all(String::is_empty), "{errors:?}");
    assert_eq!(r["completed"], n, "{r}");
    let lens: Vec<u64> = serde_json::from_value(r["output_lens"].clone()).unwrap();
    assert_eq!(lens, vec![output; n as usize]);
    // every prompt token was computed: the initial test request's and the
    // n requests' (one prompt for all would leave all but the last token
    // of each to the slot's prompt cache)
    let computed = metric(&e.url, "llamacpp:prompt_tokens_total") - before;
    assert_eq!(computed, ((n + 1) * input) as f64, "prompt tokens computed");
}

const PROFILE: &str = "models/llama-cpp-tiny-cpu.toml";

/// The tests' length mix: (input, output) token ranges.
const MIX: (&str, &str) = ("64..192", "16..48");

/// `qsim calibrate bench` against `url`: `n` requests at `rate`/s with
/// `lens` (input, output) token ranges, prompts as token ids, the result
/// JSON into `out`.
fn bench_cmd(
    url: &str,
    rate: f64,
    n: u32,
    seed: u64,
    out: &str,
    lens: (&str, &str),
) -> std::process::Command {
    let mut c = qsim();
    c.args(["calibrate", "bench", "--target", url])
        .args([
            "--rate",
            &format!("{rate:.3}"),
            "--requests",
            &n.to_string(),
        ])
        .args(["--input-len", lens.0, "--output-len", lens.1])
        .args(["--token-ids", "300..31999", "--seed", &seed.to_string()])
        .args(["--out", out]);
    c
}

/// The engine's decode step against batch size and context, as measured
/// (issue 24, item 2): for `b` = 1 to 8 (its slots), three rounds of `b`
/// requests at once with 64-token answers, once with 16-token prompts and
/// once with 384-token ones. A round's step time is read in its lockstep
/// window ([`lockstep_step_ms`]): from the moment every request has its
/// first token to the moment the first one finishes, every step decodes
/// exactly `b` sequences and nothing else, at a mean context of the
/// prompt + 32 tokens; each entry is the median of its three rounds.
/// Returns the base profile with `decode_step_ms` (context 48) and
/// `decode_step_ms_long` (context 416) set, written into `dir`.
///
/// Why the window, not the round's mean ITL (issue 42): the requests of a
/// round reach the engine ~1 ms apart, so the later prompts are computed
/// in steps of their own while the earlier requests decode; each such step
/// is one of their gaps. With 384-token prompts it costs 100–150 ms, and
/// the round's mean ITL at `b` = 8 was 26.3 ms against 17.9 ms per step in
/// the window (b = 2: 10.7 against 9.1; one run under load, 2026-12-04).
/// The table is the decode-only step; the prompt steps are the model's
/// other terms, so the mean charged them twice, most at the long context
/// that mid-load decodes interpolate toward.
///
/// Why two contexts: llama.cpp's CPU flash attention runs a step of fewer
/// than 64 query tokens row by row over every used cell of the one KV
/// buffer (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`), the other
/// sequences' masked cells included, so a decode step's cost grows with
/// the batch times the buffer's used cells: 8 sequences decoded at 25 ms
/// per step with 16-token prompts, 38–49 ms with 400-token ones and 67–78
/// ms with 800-token ones (1 sequence: 10.6, 11.4–14.3 and 12.3–15.4 ms;
/// quiet machine). The tests' requests decode at contexts of 64 to 240.
///
/// Why rounds, and why `-kvu`: without a unified KV buffer (llama-server's
/// behaviour when `-np` is given without `-kvu`) each slot has its own KV
/// stream, and a batch is split into one ubatch per run of consecutive
/// busy slot ids (`llama_batch_allocr::split_equal` with `sequential`, in
/// the vendored llama.cpp), each reading all the weights. A new task gets
/// the least recently used slot, so the same `b` measured 16.0 ms per step
/// on a fresh engine and 22.7–37.9 ms in eleven later rounds (quiet
/// machine), steady within a round: a cost that depends on which slots are
/// busy, which the server model does not know. With `-kvu` (one stream,
/// one ubatch per step) the same rounds gave 16.1–25.9 ms under a
/// compiler's load and 16.7–19.6 ms in another set, and the table is close
/// to monotone. The median of three rounds guards against one slowed
/// round.
fn measured_profile(url: &str, dir: &std::path::Path, seed: u64) -> std::path::PathBuf {
    let mut tables = Vec::new();
    for (prompt, label) in [(16u32, "short"), (384, "long")] {
        let mut ms = Vec::new();
        for b in 1..=8u32 {
            let mut rounds = Vec::new();
            let mut means = Vec::new();
            for r in 0..3u64 {
                let seed = seed * 1000 + 100 * prompt as u64 + 10 * r + b as u64;
                let v = run_bench(
                    url,
                    dir,
                    &format!("decode{prompt}-{b}-{r}.json"),
                    (1000.0, b, seed),
                    (&format!("{prompt}..{prompt}"), "64..64"),
                )
                .1;
                rounds.push(lockstep_step_ms(&v));
                means.push(f(&v, "/mean_itl_ms"));
            }
            eprintln!(
                "decode step (ms) with {b} decoding, {prompt}-token prompts, three rounds: {rounds:.2?} (mean ITL {means:.2?})"
            );
            ms.push(median(rounds));
        }
        eprintln!("decode step (ms) by batch 1..8, {label} context: {ms:.2?}");
        tables.push(
            ms.iter()
                .map(|x| format!("{x:.4}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    let base =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PROFILE))
            .unwrap();
    let table = format!(
        "[iteration]\ndecode_step_ms = [{}]\ndecode_step_context = 48\n\
         decode_step_ms_long = [{}]\ndecode_step_context_long = 416",
        tables[0], tables[1]
    );
    let text = base.replacen("\n[iteration]\n", &format!("\n{table}\n"), 1);
    assert!(text.contains("\n[iteration]\ndecode_step_ms = ["), "{text}");
    let path = dir.join("measured.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The decode step of a benchmark of requests sent at once (ms): each
/// request's token times (send + TTFT, then its gaps) inside the window
/// from the last first token to the first last token, where every step
/// decodes all of them and computes no prompt; per request the window's
/// span over its gaps in it, and the mean over requests. A window of
/// fewer than two gaps (requests that never all decode together) falls
/// back to the mean ITL.
pub fn lockstep_step_ms(v: &Value) -> f64 {
    let n = v["arrival_s"].as_array().map_or(0, Vec::len);
    let times: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            let mut t = f(v, &format!("/arrival_s/{i}")) + f(v, &format!("/ttfts/{i}"));
            let mut ts = vec![t];
            for g in v["itls"][i].as_array().unwrap() {
                t += g.as_f64().unwrap();
                ts.push(t);
            }
            ts
        })
        .collect();
    let w0 = times.iter().map(|t| t[0]).fold(f64::MIN, f64::max);
    let w1 = times
        .iter()
        .map(|t| *t.last().unwrap())
        .fold(f64::MAX, f64::min);
    let steps: Vec<f64> = times
        .iter()
        .filter_map(|ts| {
            let inside: Vec<f64> = ts.iter().copied().filter(|&x| x >= w0 && x <= w1).collect();
            (inside.len() >= 3)
                .then(|| (inside[inside.len() - 1] - inside[0]) / (inside.len() - 1) as f64)
        })
        .collect();
    if steps.is_empty() {
        return f(v, "/mean_itl_ms");
    }
    1e3 * steps.iter().sum::<f64>() / steps.len() as f64
}

/// The coefficients fitted on top of a measured decode table: the prompt
/// tokens' compute, the prefill-only step's and each prefilling sequence's
/// CPU, and the HTTP ingress (the bandwidth term is unused with a table).
const MEASURED_FIT: &str = "iteration.compute_efficiency,iteration.cpu_overhead_ms,iteration.cpu_per_seq_us,iteration.ingress_ms";
/// `qsim calibrate server`'s default: the roofline's five.
const DEFAULT_FIT: &str = "iteration.bandwidth_efficiency,iteration.compute_efficiency,iteration.cpu_overhead_ms,iteration.cpu_per_seq_us,iteration.ingress_ms";

/// One `qsim calibrate bench` against the engine at (rate, requests,
/// seed) with `lens`, every request completed: the result JSON's path, its
/// contents and the command's summary line.
fn run_bench(
    url: &str,
    dir: &std::path::Path,
    name: &str,
    (rate, n, seed): (f64, u32, u64),
    lens: (&str, &str),
) -> (String, Value, String) {
    let file = dir.join(name).to_str().unwrap().to_string();
    let o = bench_cmd(url, rate, n, seed, &file, lens).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let errors: Vec<&str> = v["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|e| !e.is_empty())
        .collect();
    assert_eq!(
        v["completed"].as_u64(),
        Some(n as u64),
        "{name}: {} resends; errors {errors:?}",
        v["retries"]
    );
    let line = String::from_utf8_lossy(&o.stdout).trim().to_string();
    (file, v, line)
}

/// [`run_bench`] with the tests' length mix, its summary line printed.
fn bench(url: &str, dir: &std::path::Path, name: &str, rate: f64, n: u32, seed: u64) -> String {
    let (file, _, line) = run_bench(url, dir, name, (rate, n, seed), MIX);
    eprintln!("{line}");
    file
}

fn f(v: &Value, p: &str) -> f64 {
    v.pointer(p)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no {p} in {v}"))
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Held-out benchmark rates, as fractions of the burst's rate R: in the
/// test command two (below and past saturation); in the judged run
/// ([`judge`]) six from 20 % to 120 % of R, none used in the fit
/// (issue 42's acceptance).
fn holdout_fracs() -> &'static [f64] {
    if judge() {
        &[0.2, 0.4, 0.55, 0.75, 1.0, 1.2]
    } else {
        &[0.45, 1.3]
    }
}

/// `QSIM_ENGINE_JUDGE=1`: the timing verdicts are judged (a quiet
/// machine; `scripts/engine-judge.sh`), with three repeats and six
/// held-out rates; otherwise they are reported only, one repeat.
fn judge() -> bool {
    std::env::var_os("QSIM_ENGINE_JUDGE").is_some_and(|v| v != "0")
}

/// Calibrate → plan → enforce repeats: `QSIM_ENGINE_REPEATS`, default 3
/// when judged and 1 in the test command (its counted verdicts hold on
/// every repeat; one keeps the engine phase within its 10 minutes).
fn repeats() -> u64 {
    std::env::var("QSIM_ENGINE_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(if judge() { 3 } else { 1 })
}

/// The first repeat's index, `QSIM_ENGINE_REPEAT_FROM` (default 0): each
/// repeat draws its seeds from its index, so a judged run split over
/// several invocations ([`record_file`]) measures with each repeat's own.
fn repeat_from() -> u64 {
    std::env::var("QSIM_ENGINE_REPEAT_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `QSIM_ENGINE_RECORD=FILE`: each repeat's figures are appended to FILE
/// (one JSON line per repeat), and the timing verdicts are computed over
/// every repeat FILE holds, this invocation's and earlier ones'. So the
/// judged run can be made one repeat per invocation
/// (`scripts/engine-judge.sh --repeat K`), each on a machine kept quiet
/// for its own span; it is judged once FILE holds three repeats.
fn record_file() -> Option<std::path::PathBuf> {
    std::env::var_os("QSIM_ENGINE_RECORD")
        .filter(|v| !v.is_empty())
        .map(Into::into)
}

/// The repeats of a judged run: three (issue 42's three calibrations).
const JUDGED_REPEATS: usize = 3;

/// One repeat's figures: the held-out errors (predicted / measured − 1)
/// by "{variant} {rate} % {metric}", the fitted coefficients with their
/// intervals, the plan's E2E p50 error, and the per-consumer admission
/// counts off the plan (the race for the unreserved pool).
#[derive(serde::Serialize, serde::Deserialize)]
struct RepeatRecord {
    rep: u64,
    errs: std::collections::BTreeMap<String, f64>,
    coefficients: Value,
    plan_e2e_p50: f64,
    race: Vec<String>,
}

/// One calibration: the fitted profile, its saturation (requests/s), the
/// fitted coefficients as `qsim calibrate server --format json` gives
/// them (with their intervals).
#[derive(Clone)]
struct Calibrated {
    profile: std::path::PathBuf,
    sat: f64,
    /// The burst's measured rate when it was fitted (R).
    burst_rate: f64,
    coefficients: Value,
}

/// The engine's first calibration in this process, kept for the drift
/// test (the same binary, model and flags: the same engine), which then
/// needs no calibration of its own.
static CALIBRATED: std::sync::Mutex<Option<Calibrated>> = std::sync::Mutex::new(None);

/// One calibration of the real engine (issue 24, item 3), as the user
/// runs it: the decode step at batch 1–8 measured into the profile's two
/// tables ([`measured_profile`]); the engine's saturation measured with a
/// burst (every request at once; completions per second with a standing
/// backlog, [`backlog_rate`]); benchmarks at 30, 60 and 85 % of the
/// burst's rate R for the fit, and at [`holdout_fracs`] held out, measured
/// interleaved with them so that a stretch of the machine's slowness falls
/// on both kinds. `qsim calibrate server` fits four coefficients on the
/// measured tables ([`MEASURED_FIT`]) on the three fit files alone, each
/// replayed at its recorded send times, with their 95 % profile intervals
/// (a coefficient the files do not pin down is fixed at the base
/// profile's value and said), writes the fitted profile
/// (`DIR/fitted.toml`) and predicts the held-out files and the
/// saturation; each error (predicted / measured − 1) goes into `errs`
/// under "measured {rate} % {metric}". Judged runs also report the same
/// tables with a finished request's cells freed at once ("freed …", the
/// profile's `finished_cells_held` off) and the roofline profile's fit
/// ("roofline …"), on the same files.
fn calibrate_and_predict(
    url: &str,
    dir: &std::path::Path,
    rep: u64,
    errs: &mut std::collections::BTreeMap<String, Vec<f64>>,
) -> Calibrated {
    let measured = measured_profile(url, dir, 200 + 10 * rep);
    let burst = bench(url, dir, "burst.json", 1000.0, 48, 100 + rep);
    let b: Value = serde_json::from_str(&std::fs::read_to_string(&burst).unwrap()).unwrap();
    let sat = f(&b, "/request_throughput");
    let sat_backlog = backlog_rate(&b);
    // fit files first (30, 60, 85 %), then the held-out ones, measured
    // interleaved: fit, held out, fit, held out, ...
    let hold = holdout_fracs();
    let fracs: Vec<f64> = [0.3, 0.6, 0.85].iter().chain(hold).copied().collect();
    let mut order: Vec<usize> = Vec::new();
    for k in 0..fracs.len() {
        if k < 3 {
            order.push(k);
        }
        if 3 + k < fracs.len() {
            order.push(3 + k);
        }
    }
    let mut files = vec![String::new(); fracs.len()];
    for k in order {
        let frac = fracs[k];
        let n = if frac > 1.0 { 60 } else { 40 };
        let seed = 10 * rep + k as u64 + 1;
        files[k] = bench(url, dir, &format!("b{k}.json"), frac * sat, n, seed);
    }
    let profile = dir.join("fitted.toml");
    // the same tables with a finished request's cells freed at once (the
    // profile holds them until the next request starts): reported beside
    let text = std::fs::read_to_string(&measured).unwrap();
    assert!(text.contains("\nfinished_cells_held = true\n"));
    let freed = dir.join("measured-freed.toml");
    std::fs::write(&freed, text.replace("\nfinished_cells_held = true\n", "\n")).unwrap();
    let mut out = None;
    let variants: &[(&str, &std::ffi::OsStr, &str)] = &[
        ("measured", measured.as_os_str(), MEASURED_FIT),
        ("freed", freed.as_os_str(), MEASURED_FIT),
        ("roofline", std::ffi::OsStr::new(PROFILE), DEFAULT_FIT),
    ];
    for &(label, base, fit) in variants.iter().take(if judge() { 3 } else { 1 }) {
        let mut c = qsim();
        c.args(["calibrate", "server", "--profile"])
            .arg(base)
            .args(["--fit", fit])
            .args([&files[0], &files[1], &files[2]]);
        for h in &files[3..] {
            c.args(["--holdout", h]);
        }
        c.args(["--format", "json", "--recorded-arrivals"]);
        if label == "measured" {
            c.arg("--out").arg(&profile);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let fit: Value = serde_json::from_slice(&o.stdout).unwrap();
        eprintln!("repeat {rep} {label}: saturation measured {sat:.3}/s; fit:");
        for k in fit["coefficients"].as_array().unwrap() {
            eprintln!(
                "  {} = {:.4} ({}, 95 % {} {})",
                k["name"].as_str().unwrap(),
                f(k, "/fit"),
                k["status"].as_str().unwrap(),
                k["ci95"],
                k["ci95_ends"]
            );
        }
        for w in fit["warnings"].as_array().unwrap() {
            eprintln!("  warning: {}", w.as_str().unwrap());
        }
        for (h, frac) in hold.iter().enumerate() {
            let ho = &fit["holdout"][h];
            let pct = (frac * 100.0).round();
            for m in ["ttft_ms", "itl_ms", "e2e_ms"] {
                let (obs, pred) = (
                    f(ho, &format!("/observed/{m}")),
                    f(ho, &format!("/fitted/{m}")),
                );
                eprintln!(
                    "  held out {pct} % of R {m}: measured {obs:.2}, predicted {pred:.2} ({:+.1} %)",
                    (pred / obs - 1.0) * 100.0
                );
                errs.entry(format!("{label} {pct} % {m}"))
                    .or_default()
                    .push(pred / obs - 1.0);
            }
        }
        let pred_sat = f(&fit, "/saturation_rps/fitted");
        eprintln!(
            "  saturation (completions/s between the 10th and 90th percentile of completions \
             with a standing backlog): measured {sat_backlog:.3} (burst's whole run {sat:.3}), \
             predicted {pred_sat:.3} ({:+.1} %)",
            (pred_sat / sat_backlog - 1.0) * 100.0
        );
        errs.entry(format!("{label} saturation"))
            .or_default()
            .push(pred_sat / sat_backlog - 1.0);
        if label == "measured" {
            // the fit's own residuals (the plan's E2E rests on them)
            for b in fit["fit"].as_array().unwrap() {
                let e =
                    |m: &str| f(b, &format!("/fitted/{m}")) / f(b, &format!("/observed/{m}")) - 1.0;
                eprintln!(
                    "  fit {} at {}/s: TTFT {:+.1} %, ITL {:+.1} %, E2E {:+.1} % (E2E measured {:.0} ms)",
                    b["file"]
                        .as_str()
                        .unwrap_or("?")
                        .rsplit('/')
                        .next()
                        .unwrap_or("?"),
                    b["request_rate"],
                    e("ttft_ms") * 100.0,
                    e("itl_ms") * 100.0,
                    e("e2e_ms") * 100.0,
                    f(b, "/observed/e2e_ms")
                );
            }
            out = Some(Calibrated {
                profile: profile.clone(),
                sat: pred_sat,
                burst_rate: sat,
                coefficients: fit["coefficients"].clone(),
            });
        }
    }
    out.expect("the measured fit ran")
}

/// The completion rate of a benchmark result with a standing backlog, as
/// `qsim calibrate server` states a profile's saturation: completions per
/// second between the 10th and the 90th percentile of completion times
/// (each request's send + TTFT + its gaps), so the start (the first batch
/// filling) and the drain (fewer requests than slots) are left out, as
/// they are from the model's figure. A burst's whole-run rate
/// (`request_throughput`) counts both and is lower.
fn backlog_rate(b: &Value) -> f64 {
    let a = b["arrival_s"].as_array().expect("arrival_s");
    let mut ends: Vec<f64> = a
        .iter()
        .enumerate()
        .filter(|(i, _)| b["errors"][i].as_str() == Some(""))
        .map(|(i, x)| {
            let gaps: f64 = b["itls"][i]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g.as_f64().unwrap())
                .sum();
            x.as_f64().unwrap() + f(b, &format!("/ttfts/{i}")) + gaps
        })
        .collect();
    ends.sort_by(f64::total_cmp);
    let (lo, hi) = (ends.len() / 10, ends.len() * 9 / 10);
    (hi - lo) as f64 / (ends[hi] - ends[lo])
}

/// The plan file of [`plan_and_enforce`]: the fitted profile
/// (`model`), `capacity` RPM shared by A (40 % reserved), B (30 %) and dev
/// (the unreserved pool), each offering twice the capacity for four
/// minutes; inputs as the benches draw them, every answer exactly
/// `max_tokens` = 32 tokens long (the engine never stops early).
fn engine_plan_file(model: &str, capacity: u32) -> String {
    format!(
        r#"kind = "shared"
title = "llama-server (1 thread, 8 slots) shared by A, B and dev"
model = "{model}"
replicas = 1
max_tokens = 32
reject_latency_ms = 2.0
input_tokens = {{ dist = "uniform", min = 64, max = 193 }}
output_tokens = {{ dist = "const", value = 32 }}

[deployment]
capacity = {capacity}
unit = "rpm"
threshold = 0.8
semantics = "strict-floors"
accounting = "reserve_refund"

[defaults]

[[consumer]]
name = "A"
reserved_pct = 40

[[consumer]]
name = "B"
reserved_pct = 30

[[consumer]]
name = "dev"
reserved_pct = 0

[[scenario]]
name = "heavy"
description = "each consumer at twice the capacity (6x in all)"
duration_s = 240
load = [{{ who = "all", rpm = {rpm} }}]
"#,
        rpm = 2 * capacity
    )
}

/// Plan → enforce → compare on the real engine (issue 24, item 4), on
/// the profile `fitted.toml` in `dir` with saturation `fitted_sat`: a
/// shared deployment sized at 60 % of that saturation ([`engine_plan_file`]),
/// `qsim plan --emit-proxy-config`, `qsim proxy` with that config in front
/// of `llama-server`, and `qsim load` of the plan's heavy scenario through
/// it in real time with prompts as token ids (`--token-ids`: every prompt
/// its own, so no prefix cache hides a prefill) beside the plan
/// (`--compare-with-sim`), with the load's `seed`.
///
/// The seed differs per repeat and from every benchmark's: a row's token
/// ids are drawn from (seed, row), and llama-server keeps finished prompts
/// in its RAM prompt cache (8 GiB by default), so a second load with the
/// same seed on the same engine found 2,280 of its prompts already cached
/// (prompt work of one token instead of ~130) and ran 18 % faster than
/// the plan; with seed 1, as bench `b0`'s, the first 25 rows were cached.
///
/// The load replays the plan's own arrivals (same seed), so each consumer's
/// admitted requests per saturated minute are compared with the plan's for
/// that seed: within 5 % (counted outcomes; which consumer wins a unit of
/// the unreserved pool is decided within milliseconds, so a request either
/// way is allowed for); their total is the capacity. Every attempt must be
/// answered 2xx or 429. Returns the plan's E2E p50 of admitted requests
/// (its median over seeds) and the observed one, in seconds, and the
/// count checks that failed.
fn plan_and_enforce(
    url: &str,
    dir: &std::path::Path,
    fitted_sat: f64,
    seed: u64,
) -> (f64, f64, Vec<String>, Vec<String>) {
    let capacity = (0.6 * fitted_sat * 60.0).floor() as u32;
    eprintln!("engine: capacity {capacity} RPM");
    assert!(
        capacity >= 30,
        "{capacity} RPM: the engine is too slow to plan for"
    );

    // plan, and its proxy config
    let plan = dir.join("plan.toml");
    std::fs::write(&plan, engine_plan_file("fitted.toml", capacity)).unwrap();
    let cfg = dir.join("proxy.toml");
    let o = qsim()
        .args(["plan", "--scenarios"])
        .arg(&plan)
        .arg("--emit-proxy-config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // enforce: the proxy in front of the engine; the heavy scenario through it
    let child = qsim()
        .args(["proxy", "--allow-placeholder-keys", "--config"])
        .arg(&cfg)
        .args(["--listen", "127.0.0.1:0", "--upstream", url])
        .args(["--threads", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qsim proxy");
    let mut proxy = Proc(child);
    let proxy_url = crate::common::proxy_url(&mut proxy);
    let load = qsim()
        .arg("load")
        .arg(&plan)
        .args(["--target", &proxy_url, "--scenario", "heavy"])
        .args(["--path", "/v1/completions", "--token-ids", "300..31999"])
        .args([
            "--threads",
            "1",
            "--timeout",
            "60s",
            "--seed",
            &seed.to_string(),
        ])
        .args(["--compare-with-sim", "--sim-seeds", "5", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stderr)
    );
    let r: Value = serde_json::from_slice(&load.stdout).unwrap();
    eprintln!(
        "sends behind schedule: max {} s (virtual)",
        r["send_lag_max_s"]
    );
    assert!(
        r["send_lag_max_s"].as_f64().unwrap() <= 1.0,
        "the load generator fell over 1 s behind its schedule: {r}"
    );

    // every attempt answered 2xx or 429
    assert_eq!(r["abandoned"], 0);
    for c in r["consumers"].as_array().unwrap() {
        assert_eq!(c["unanswered"], 0, "{c}");
        assert_eq!(c["other_status"], json!([]), "{c}");
        assert_eq!(
            c["admitted"].as_u64().unwrap() + c["limited"].as_u64().unwrap(),
            c["offered"].as_u64().unwrap(),
            "{c}"
        );
    }
    let sat_min: Vec<bool> = r["plan_saturated"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_bool().unwrap())
        .collect();
    assert_eq!(
        sat_min,
        [false, true, true, true],
        "the plan saturates minutes 1-3"
    );
    // per consumer: the race for the unreserved pool, decided by when each
    // request reaches the proxy (timing); their total: the capacity (counted)
    let (mut bad, mut race) = (Vec::new(), Vec::new());
    let mut total = (0.0, 0.0);
    for row in r["admitted_per_saturated_min"].as_array().unwrap() {
        let (c, plan, ob) = (
            row["consumer"].as_str().unwrap(),
            f(row, "/plan"),
            f(row, "/observed"),
        );
        total = (total.0 + plan, total.1 + ob);
        eprintln!(
            "{c:>4} admitted per saturated minute: plan {plan:.1} (median over seeds {}), observed {ob:.1} ({:+.1} %)",
            row["plan_median"],
            (ob / plan - 1.0) * 100.0
        );
        // a request either way in one of the three minutes: 1/3 per minute
        if (ob - plan).abs() > (0.05 * plan).max(1.0 / 3.0 + 1e-9) {
            race.push(format!(
                "{c}: observed {ob:.1} per saturated minute, plan {plan:.1}"
            ));
        }
    }
    eprintln!(
        "all: plan {:.1}, observed {:.1} per saturated minute (capacity {capacity})",
        total.0, total.1
    );
    if (total.1 - total.0).abs() > 0.05 * total.0 {
        bad.push(format!("all: observed {:.1}, plan {:.1}", total.1, total.0));
    }
    let (pe2e, oe2e) = (f(&r, "/plan_e2e_p50_s/plan_median"), f(&r, "/e2e_ok/p50_s"));
    eprintln!(
        "E2E p50 of admitted requests: plan {pe2e:.3} s, observed {oe2e:.3} s ({:+.1} %) over {} requests",
        (oe2e / pe2e - 1.0) * 100.0,
        r["e2e_ok"]["count"]
    );
    assert!(
        pe2e > 0.0 && oe2e > 0.0 && r["e2e_ok"]["count"].as_u64() > Some(100),
        "E2E measured on both sides: {r}"
    );
    (pe2e, oe2e, bad, race)
}

/// Measure → calibrate → predict → plan → enforce → compare on the real
/// engine (issue 24, items 3 and 4; issue 42): [`repeats`] repeats on one
/// engine, each from a fresh measurement: [`calibrate_and_predict`] (the
/// held-out errors and the fitted profile), then [`plan_and_enforce`] on
/// that profile.
///
/// **Judged always** (counted outcomes, whatever the machine's speed):
/// every step succeeds, every attempt of every load is answered 2xx or 429
/// and counted once, the plan saturates minutes 1–3, and the admitted
/// requests of all consumers per saturated minute are within 5 % of the
/// plan's (the capacity). The test command runs one repeat (the engine
/// phase within 10 minutes).
///
/// **Judged with `QSIM_ENGINE_JUDGE=1`** (`scripts/engine-judge.sh`: three
/// repeats, six held-out rates from 20 to 120 % of R; wall-clock timings of
/// a real engine, reported, not judged, otherwise): at every held-out rate
/// the median over the repeats of |error| of mean ITL and mean E2E within
/// 10 % and of mean TTFT within 20 % below saturation (rates under R), and
/// no rate where every repeat errs the same way by more than 5 % (ITL,
/// E2E); the saturation throughput within 10 %; the three calibrations'
/// fitted coefficients within each other's 95 % intervals (pairwise
/// overlap); the plan's E2E p50 of admitted requests within 20 % of the
/// observed one; and each consumer's admitted per saturated minute within
/// 5 % of the plan's (the race for the unreserved pool, decided by when
/// requests reach the proxy). Why not always: the project's rule is that
/// no verdict depends on wall-clock speed (CI is a shared 2-core machine
/// that may be loaded), and this engine's speed is the machine's. With two
/// niced compilers on the other core (2026-12-03, AMD EPYC, 2 vCPUs), the
/// burst's saturation was 6.1, 6.4 and 11.7 req/s in the three repeats and
/// the medians missed by +24 % (ITL below), +22 % (E2E below) and +30 %
/// (saturation); one consumer's admitted count by 5.6 %; the counted
/// outcomes held.
///
/// Record: `docs/guide/proxy.md`, "On a real engine: llama.cpp's server",
/// and `docs/fidelity.md` (issue 42).
#[test]
#[ignore = "real engine timing: scripts/test.sh runs it alone (-- --ignored engine::)"]
fn engine_calibrate_predict_plan_enforce() {
    crate::live!(Engine);
    let judged = judge();
    let e = start(1, 8, 8192);
    let mut bad = Vec::new();
    let mut records = Vec::new();
    for rep in repeat_from()..repeat_from() + repeats() {
        let dir = tempfile::tempdir().unwrap();
        let mut errs: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
        let cal = calibrate_and_predict(&e.url, dir.path(), rep, &mut errs);
        {
            let mut kept = CALIBRATED.lock().unwrap();
            if kept.is_none() {
                let keep = tempfile::tempdir().unwrap().keep();
                let profile = keep.join("fitted.toml");
                std::fs::copy(&cal.profile, &profile).unwrap();
                *kept = Some(Calibrated {
                    profile,
                    ..cal.clone()
                });
            }
        }
        let (pe2e, oe2e, b, race) = plan_and_enforce(&e.url, dir.path(), cal.sat, 1000 + rep);
        eprintln!(
            "repeat {rep}: E2E p50 of admitted requests: plan {pe2e:.3} s, observed {oe2e:.3} s \
             (observed {:+.1} % from the plan)",
            (oe2e / pe2e - 1.0) * 100.0
        );
        bad.extend(b.into_iter().map(|x| format!("repeat {rep}: {x}")));
        let record = RepeatRecord {
            rep,
            errs: errs
                .into_iter()
                .map(|(k, xs)| {
                    assert_eq!(xs.len(), 1, "{k}: one figure per repeat");
                    (k, xs[0])
                })
                .collect(),
            coefficients: cal.coefficients.clone(),
            plan_e2e_p50: oe2e / pe2e - 1.0,
            race: race
                .into_iter()
                .map(|x| format!("repeat {rep}: {x}"))
                .collect(),
        };
        if let Some(path) = record_file() {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("QSIM_ENGINE_RECORD {}: {e}", path.display()));
            writeln!(file, "{}", serde_json::to_string(&record).unwrap()).unwrap();
        }
        records.push(record);
    }
    // the timing verdicts over every repeat: this run's, or the record's
    // (which holds this run's and the earlier invocations')
    if let Some(path) = record_file() {
        let text = std::fs::read_to_string(&path).unwrap();
        records = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a repeat's record"))
            .collect();
        let reps: Vec<u64> = records.iter().map(|r| r.rep).collect();
        eprintln!("record {}: repeats {reps:?}", path.display());
        let mut distinct = reps.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            reps.len(),
            "a repeat recorded twice: {reps:?}"
        );
    }
    let mut errs: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for r in &records {
        for (k, x) in &r.errs {
            errs.entry(k.clone()).or_default().push(*x);
        }
    }
    let coefs: Vec<Value> = records.iter().map(|r| r.coefficients.clone()).collect();
    let e2e: Vec<f64> = records.iter().map(|r| r.plan_e2e_p50).collect();
    let mut timing: Vec<String> = records.iter().flat_map(|r| r.race.clone()).collect();
    for (k, xs) in &errs {
        if !k.starts_with("measured ") {
            eprintln!(
                "{k}: median error {:+.1} % over {xs:.3?}",
                median(xs.clone()) * 100.0
            );
        }
    }
    // per held-out rate: the median |error| and the sign of every repeat
    for frac in holdout_fracs() {
        let pct = (frac * 100.0).round();
        for (m, bound) in [("itl_ms", 0.10), ("e2e_ms", 0.10), ("ttft_ms", 0.20)] {
            let xs = &errs[&format!("measured {pct} % {m}")];
            let med = median(xs.iter().map(|x| x.abs()).collect());
            eprintln!(
                "measured {pct} % of R {m}: median |error| {:.1} % over {:+.3?}",
                med * 100.0,
                xs
            );
            if m == "ttft_ms" && *frac >= 1.0 {
                continue; // queueing past saturation: reported only
            }
            if med > bound {
                timing.push(format!(
                    "{pct} % of R {m}: median |error| {:.1} %",
                    med * 100.0
                ));
            }
            let one_way =
                xs.len() >= 2 && (xs.iter().all(|&x| x > 0.05) || xs.iter().all(|&x| x < -0.05));
            if m != "ttft_ms" && one_way {
                timing.push(format!(
                    "{pct} % of R {m}: every repeat errs the same way by more than 5 %: {xs:+.3?}"
                ));
            }
        }
    }
    // the plan's E2E p50: the observed one's error from it (observed / plan - 1)
    errs.insert("measured plan e2e_p50".into(), e2e);
    for (k, bound) in [("saturation", 0.10), ("plan e2e_p50", 0.20)] {
        let k = &format!("measured {k}");
        let xs = &errs[k];
        let m = median(xs.clone());
        eprintln!("{k}: median error {:+.1} % over {:.3?}", m * 100.0, xs);
        if m.abs() > bound {
            timing.push(format!("{k}: median error {:+.1} %", m * 100.0));
        }
    }
    // the calibrations' coefficients: each fitted value against the others'
    // intervals (reported), and pairwise overlap of the intervals (judged)
    for (i, a) in coefs.iter().enumerate() {
        for b in coefs.iter().skip(i + 1) {
            for (ka, kb) in a.as_array().unwrap().iter().zip(b.as_array().unwrap()) {
                let name = ka["name"].as_str().unwrap();
                let (Some(ia), Some(ib)) = (ka["ci95"].as_array(), kb["ci95"].as_array()) else {
                    eprintln!(
                        "{name}: {} / {} (a fixed one has no interval)",
                        ka["status"], kb["status"]
                    );
                    continue;
                };
                let (a0, a1) = (ia[0].as_f64().unwrap(), ia[1].as_f64().unwrap());
                let (b0, b1) = (ib[0].as_f64().unwrap(), ib[1].as_f64().unwrap());
                let (va, vb) = (f(ka, "/fit"), f(kb, "/fit"));
                eprintln!(
                    "{name}: {va:.4} in [{a0:.4}, {a1:.4}] and {vb:.4} in [{b0:.4}, {b1:.4}]: {}",
                    if (b0..=b1).contains(&va) && (a0..=a1).contains(&vb) {
                        "each inside the other's interval"
                    } else if a0 <= b1 && b0 <= a1 {
                        "intervals overlap"
                    } else {
                        "intervals disjoint"
                    }
                );
                if a0 > b1 || b0 > a1 {
                    timing.push(format!(
                        "{name}: calibrations disagree ({va:.4} in [{a0:.4}, {a1:.4}], {vb:.4} in [{b0:.4}, {b1:.4}])"
                    ));
                }
            }
        }
    }
    // judged once the three repeats are in (one invocation, or a record
    // filled by several)
    let complete = records.len() >= JUDGED_REPEATS;
    let judged = judged && complete;
    eprintln!(
        "timing verdicts over {} repeat(s) ({}): {}",
        records.len(),
        if judged {
            "QSIM_ENGINE_JUDGE set: judged"
        } else if judge() {
            "QSIM_ENGINE_JUDGE set, fewer than three repeats yet: reported, judged when the record holds three"
        } else {
            "reported, not judged: scripts/engine-judge.sh judges them on a quiet machine"
        },
        if timing.is_empty() {
            "all within their bounds".to_string()
        } else {
            timing.join("; ")
        }
    );
    if judged {
        bad.extend(timing);
    }
    assert!(bad.is_empty(), "{}", bad.join("; "));
}

/// The drift alerts of a proxy's `/metrics`: (metric, alert gauge).
fn drift_alerts(url: &str) -> Vec<(&'static str, f64)> {
    let m = crate::common::metrics(url);
    ["ttft", "itl", "e2e", "upstream_429"]
        .iter()
        .map(|k| {
            let key = format!("qsim_proxy_drift_alert{{metric=\"{k}\"}}");
            (*k, crate::common::metric(&m, &key))
        })
        .collect()
}

/// Drift on the real engine (issue 24, item 4's last part): `qsim proxy
/// --profile` with the engine's profile fitted minutes before (the first
/// calibration of [`engine_calibrate_predict_plan_enforce`] in this run,
/// [`CALIBRATED`]; run alone, its own [`calibrate_and_predict`]) in front
/// of `llama-server`, a streamed
/// open-loop load through it (`qsim calibrate bench` at half the fitted
/// saturation, prompts as token ids).
/// - 150 s on the unchanged engine: no alert at any poll;
/// - then the engine is restarted on the same port with the 16-layer model
///   of `scripts/llama-model.py` (same widths: 2.7× the time of a
///   48-request burst, measured here): an alert within 120 s.
///
/// **How it tolerates a busy machine**: the band is [0.4, 2.5], for 30 s
/// (30 s window, ≥ 20 samples), not the defaults [0.67, 1.5] for 60 s.
/// The engine's speed on a shared 2-core VM moves between the fit and the
/// run by more than the default band: in CI on 2026-12-02 the unchanged
/// engine ran 1.75× slower on every metric than the profile fitted three
/// minutes before (TTFT 1.76, ITL 1.75, E2E 1.78; the default band alerted
/// at 67 s), while here it stayed within 0.89–1.03. The slower model moves
/// the ratios far past 2.5 (ITL 6.4, TTFT 201 at the alert): the wide band
/// separates a change of the engine from the machine's noise, and 30 s
/// sustained keeps the alert inside 120 s although the shadow lags the
/// backlog the slower engine builds (it waits for the oldest request in
/// flight).
///
/// The issue asks for the engine restarted with half its threads. On this
/// 2-core machine that change cannot be made honestly: the engine runs on
/// one thread, and with two (ggml's threads wait for each other by
/// spinning) it was 8× *slower* than with one whenever anything else ran
/// (a 48-request burst: 82.9 s against 10.6 s at a load average of 3.7;
/// 109.7 s against 7.9 s earlier), so the proxy and the load generator
/// would decide its speed. On another machine of the same kind (2026-12-03,
/// AMD EPYC, 2 vCPUs, load average 6-8) two threads with `--poll 0` were
/// not slower but barely faster: a 48-request burst in 3.05 s against
/// 4.2-4.6 s with one, and 6.23 against 5.58 req/s at saturation (1.12x),
/// a change smaller than the machine's own noise (the band above). A
/// deeper model is a change of the engine's speed that does not depend on
/// what else runs.
#[test]
#[ignore = "real engine timing: scripts/test.sh runs it alone (-- --ignored engine::)"]
fn engine_drift_alerts_after_a_slower_model_and_not_before() {
    crate::live!(Engine);
    let (_, model) = crate::common::llama_paths();
    let slow_model = model.with_file_name("qsim-tiny-llama-16l.gguf");
    assert!(
        slow_model.is_file(),
        "{} missing: scripts/llama-deps.sh writes it",
        slow_model.display()
    );
    let port = free_port();
    let e = start_at(&model, port, 1, 8, 8192);
    let dir = tempfile::tempdir().unwrap();
    // the calibration of this run's first test, if the engine still runs
    // at the speed it was fitted at (a burst within 25 % of its rate: the
    // machine's load may have moved since); else a calibration of its own
    let kept = CALIBRATED.lock().unwrap().clone().filter(|c| {
        let b = bench(&e.url, dir.path(), "drift-burst.json", 1000.0, 48, 7);
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&b).unwrap()).unwrap();
        let r = f(&v, "/request_throughput");
        eprintln!(
            "drift: burst {r:.3}/s now, {:.3}/s when the kept profile was fitted",
            c.burst_rate
        );
        (r / c.burst_rate - 1.0).abs() <= 0.25
    });
    let Calibrated {
        profile,
        sat: fitted_sat,
        ..
    } = match kept {
        Some(c) => {
            eprintln!(
                "drift: the profile calibrated earlier in this run ({})",
                c.profile.display()
            );
            c
        }
        None => calibrate_and_predict(&e.url, dir.path(), 9, &mut Default::default()),
    };
    let cfg = dir.path().join("proxy.toml");
    std::fs::write(
        &cfg,
        format!(
            "kind = \"proxy\"\n[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\n\
             unknown_consumer = \"A\"\nprofile = \"{}\"\n[proxy.keys]\nA = [\"key-a\"]\n\
             [proxy.drift]\nband = [0.4, 2.5]\nfor_s = 30\n\
             [deployment]\ncapacity = 100000\n[[consumer]]\nname = \"A\"\n",
            e.url,
            profile.display()
        ),
    )
    .unwrap();
    let child = qsim()
        .args(["proxy", "--config"])
        .arg(&cfg)
        .args(["--threads", "1"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("proxy.log")).unwrap())
        .spawn()
        .expect("start qsim proxy");
    let mut proxy = Proc(child);
    let url = crate::common::proxy_url(&mut proxy);
    assert!(drift_alerts(&url).iter().all(|a| a.1 == 0.0));

    // the load: half the fitted saturation, for the whole test (330 s)
    let rate = 0.5 * fitted_sat;
    let n = (rate * 330.0).ceil() as u32;
    let out = dir.path().join("load.json");
    let load = bench_cmd(&url, rate, n, 400, out.to_str().unwrap(), MIX)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _load = Proc(load);
    let log = || std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();
    let t0 = Instant::now();
    let mut last = Vec::new();
    let ratio = |m: &[(String, f64)], k: &str| {
        crate::common::metric(m, &format!("qsim_proxy_drift_ratio{{metric=\"{k}\"}}"))
    };
    // the ratios' range over the polls once estimated (the machine's noise)
    let mut range = [(f64::INFINITY, 0.0f64); 3];
    while t0.elapsed() < Duration::from_secs(150) {
        std::thread::sleep(Duration::from_secs(1));
        let m = crate::common::metrics(&url);
        for (k, r) in ["ttft", "itl", "e2e"].iter().zip(range.iter_mut()) {
            let x = ratio(&m, k);
            if x > 0.0 {
                *r = (r.0.min(x), r.1.max(x));
            }
        }
        let a = drift_alerts(&url);
        assert!(
            a.iter().all(|x| x.1 == 0.0),
            "alert on the unchanged engine at {:.0} s: {a:?}\n{m:?}\n{}",
            t0.elapsed().as_secs_f64(),
            log()
        );
        last = m;
    }
    eprintln!(
        "unchanged engine, 150 s, no alert; ratios at the end: ttft {:.2}, itl {:.2}, e2e {:.2}; \
         ranges over the polls: ttft {:.2?}, itl {:.2?}, e2e {:.2?}",
        ratio(&last, "ttft"),
        ratio(&last, "itl"),
        ratio(&last, "e2e"),
        range[0],
        range[1],
        range[2]
    );
    for k in ["ttft", "itl", "e2e"] {
        let r = ratio(&last, k);
        assert!(r > 0.0, "{k}: no ratio estimated in 150 s");
    }

    // the change: the same port, a model twice as deep
    drop(e);
    let _slow = start_at(&slow_model, port, 1, 8, 8192);
    let t1 = Instant::now();
    let fired = loop {
        std::thread::sleep(Duration::from_secs(1));
        let a = drift_alerts(&url);
        if let Some(x) = a.iter().find(|x| x.1 == 1.0) {
            break Some((x.0, t1.elapsed()));
        }
        if t1.elapsed() > Duration::from_secs(120) {
            break None;
        }
    };
    let m = crate::common::metrics(&url);
    eprintln!(
        "after the change: {fired:?}; ratios ttft {:.2}, itl {:.2}, e2e {:.2}",
        ratio(&m, "ttft"),
        ratio(&m, "itl"),
        ratio(&m, "e2e")
    );
    let (metric, after) = fired.unwrap_or_else(|| {
        panic!(
            "no drift alert within 120 s of the slower engine: {:?}\n{}",
            drift_alerts(&url),
            log()
        )
    });
    assert!(log().contains("drift"), "the alert is logged: {}", log());
    eprintln!(
        "drift alert on {metric} {:.0} s after the change",
        after.as_secs_f64()
    );
}
