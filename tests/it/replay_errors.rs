//! `qsim replay` on bad targets and bad input, on 127.0.0.1 only, bounded
//! (a few rows each, time-scaled waits): every failed exchange is recorded
//! per attempt with its kind and text, the summary counts it, the replay
//! goes on as the policy says, and every row is in rows.csv. Third-party
//! parts where they exist (llmock from the venv: 401s, streams, truncated
//! streams); a few lines of `TcpListener` where no real server misbehaves
//! on demand (an answer that is not JSON, a plain-HTTP port behind
//! `https://`, a server that never answers).

use crate::common::{free_port, llmock, qsim_env, read_csv};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const EXP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/fmapi-pacing.toml");

/// A loopback server answering every connection with `answer` (or holding
/// it open without a word if `None`); returns its address and the requests
/// it saw (head, body).
/// The (head, body) of every request a fake server saw.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

fn fake(answer: Option<&'static str>) -> (String, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let seen = s2.clone();
            std::thread::spawn(move || {
                c.set_read_timeout(Some(Duration::from_secs(5))).ok();
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                // read the head, then content-length bytes
                let (head, body) = loop {
                    let Ok(n) = c.read(&mut tmp) else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some((h, b)) = text.split_once("\r\n\r\n") {
                        let len = h
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if b.len() >= len {
                            break (h.to_string(), b.to_string());
                        }
                    }
                    if buf.len() > 1 << 20 || !buf.is_ascii() && answer.is_none() {
                        break (String::new(), String::new());
                    }
                    if !buf.is_ascii() {
                        // a TLS ClientHello on a plain port
                        break (String::from_utf8_lossy(&buf).to_string(), String::new());
                    }
                };
                seen.lock().unwrap().push((head, body));
                match answer {
                    Some(a) => {
                        let _ = c.write_all(a.as_bytes());
                    }
                    None => std::thread::sleep(Duration::from_secs(20)),
                }
            });
        }
    });
    (format!("http://{addr}"), seen)
}

fn qsim(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    qsim_env(args, env, Duration::from_secs(60))
}

struct Out {
    attempts: Vec<BTreeMap<String, String>>,
    rows: Vec<BTreeMap<String, String>>,
    summary: Vec<BTreeMap<String, String>>,
    stdout: String,
    stderr: String,
}

impl Out {
    fn metric(&self, m: &str) -> f64 {
        self.summary
            .iter()
            .find(|r| r["metric"] == m)
            .unwrap_or_else(|| panic!("no {m} in the summary"))["value"]
            .parse()
            .unwrap()
    }
}

/// Replay `exp` with `rows` rows against `target`; it must end with exit 0.
fn replay(target: &str, exp: &str, rows: u32, extra: &[&str]) -> Out {
    replay_exit(target, exp, rows, extra, 0)
}

/// [`replay`], ending with exit `code` (its records written all the same).
fn replay_exit(target: &str, exp: &str, rows: u32, extra: &[&str], code: i32) -> Out {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let set = format!("rows={rows}");
    let mut args = vec![
        "replay",
        EXP,
        "--target",
        target,
        "--only",
        exp,
        "--set",
        &set,
        "--time-scale",
        "1000",
        "--attempt-timeout",
        "3000s",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (exit, stdout, stderr) = qsim(&args, &[("REPLAY_KEY", "k")]);
    assert_eq!(exit, code, "qsim replay against {target}: {stderr}");
    let o = Out {
        attempts: read_csv(&out.join("attempts.csv")),
        rows: read_csv(&out.join("rows.csv")),
        summary: read_csv(&out.join("summary.csv")),
        stdout,
        stderr,
    };
    assert_eq!(o.rows.len(), rows as usize, "no row lost: {:?}", o.rows);
    // the Parquet twins hold the same rows (read back with polars)
    // (a column without empty cells: `status` is empty for transport errors)
    let rows_of = qsim_results::read_column(
        &out.join("attempts.parquet"),
        "row",
        &qsim_sim::input::load_data,
    )
    .unwrap();
    let csv_rows: Vec<String> = o.attempts.iter().map(|a| a["row"].clone()).collect();
    assert_eq!(rows_of, csv_rows, "attempts.parquet vs attempts.csv");
    let rows_pq = qsim_results::read_column(
        &out.join("rows.parquet"),
        "row",
        &qsim_sim::input::load_data,
    )
    .unwrap();
    let csv_rows: Vec<String> = o.rows.iter().map(|r| r["row"].clone()).collect();
    assert_eq!(rows_pq, csv_rows, "rows.parquet vs rows.csv");
    o
}

/// Every attempt failed with `kind`; every row ended with `status`.
fn all_failed(o: &Out, kind: &str, status: &str, attempts: usize) {
    assert_eq!(o.attempts.len(), attempts, "{:#?}", o.attempts);
    for a in &o.attempts {
        assert_eq!(a["error_kind"], kind, "{a:?}");
        assert!(!a["error"].is_empty(), "{a:?}");
    }
    for r in &o.rows {
        assert_eq!(r["status"], status, "{r:?}");
        assert!(!r["error"].is_empty(), "{r:?}");
    }
    assert_eq!(o.metric("attempt_errors"), attempts as f64);
    assert_eq!(o.metric(&format!("attempt_errors.{kind}")), attempts as f64);
    assert_eq!(o.metric("ok"), 0.0);
    assert!(
        o.stdout.contains(&format!("attempt_errors.{kind}")),
        "{}",
        o.stdout
    );
}

#[test]
fn unreachable_target_every_attempt_recorded_and_retried_as_the_policy_says() {
    let url = format!("http://127.0.0.1:{}", free_port());
    // exp2: own backoff retries 5xx (a failed exchange is 599), 8 attempts,
    // each with the SDK's 2 hidden retries
    // nothing reached the target: exit 1 with one line saying so, after
    // the records are written
    let o = replay_exit(&url, "exp2-backoff", 3, &[], 1);
    all_failed(&o, "connect", "599", 3 * 8 * 3);
    let last = o.stderr.trim_end().lines().last().unwrap_or("");
    assert!(
        last.starts_with(&format!("qsim: replay: no request reached {url}")),
        "{}",
        o.stderr
    );
    assert!(last.contains("all 72 attempts failed"), "{last}");
    assert!(
        o.attempts[0]["error"].to_lowercase().contains("connect"),
        "{:?}",
        o.attempts[0]
    );
    assert_eq!(o.metric("max_attempts"), 8.0);
    assert_eq!(o.metric("failed_other"), 3.0);
}

#[test]
fn tls_failure_is_recorded_per_attempt() {
    let (url, _) = fake(Some(
        "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    ));
    let url = url.replace("http://", "https://");
    let o = replay_exit(&url, "exp1-direct", 2, &[], 1);
    // exp1: no own retry; the SDK retries the failed exchange twice
    all_failed(&o, "tls", "599", 2 * 3);
    assert!(o.stderr.contains("no request reached"), "{}", o.stderr);
}

#[test]
fn http_401_is_not_retried_and_its_message_is_kept() {
    crate::live!();
    let (_p, url) = llmock(&["--error-rate", "401=1.0"]);
    let o = replay(&url, "exp2-backoff", 3, &["--token-env", "REPLAY_KEY"]);
    assert_eq!(o.attempts.len(), 3, "{:#?}", o.attempts);
    for a in &o.attempts {
        assert_eq!(
            (a["status"].as_str(), a["error_kind"].as_str()),
            ("401", "status")
        );
        assert!(a["error"].starts_with("HTTP 401: "), "{a:?}");
    }
    for r in &o.rows {
        assert_eq!(r["status"], "401");
        assert!(r["error"].starts_with("HTTP 401"), "{r:?}");
    }
    assert_eq!(o.metric("failed_other"), 3.0);
    assert_eq!(o.metric("attempt_errors.status"), 3.0);
}

#[test]
fn an_answer_that_is_not_json_is_a_failed_exchange() {
    let (url, seen) = fake(Some(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 17\r\nconnection: close\r\n\r\n<html>oops</html>",
    ));
    let o = replay(&url, "exp1-direct", 2, &[]);
    all_failed(&o, "non_json", "599", 2 * 3);
    assert!(
        o.attempts[0]["error"].contains("<html>oops</html>"),
        "{:?}",
        o.attempts[0]
    );
    assert_eq!(seen.lock().unwrap().len(), 6);
}

#[test]
fn truncated_streams_are_failed_exchanges_and_healthy_streams_have_ttft() {
    crate::live!();
    let (_p, url) = llmock(&["--stream-fault", "truncate=1.0"]);
    let o = replay(&url, "exp1-direct", 2, &["--stream"]);
    all_failed(&o, "truncated_stream", "599", 2 * 3);
    for a in &o.attempts {
        assert_eq!(a["status"], "200", "the stream started: {a:?}");
    }
    let (_p2, url) = llmock(&["--stream-chunk-delay-ms", "2"]);
    let o = replay(&url, "exp1-direct", 3, &["--stream"]);
    assert_eq!(o.attempts.len(), 3);
    for a in &o.attempts {
        assert_eq!(a["status"], "200");
        assert_eq!(a["error_kind"], "");
        assert_eq!(a["finish_reason"], "stop");
        let ttft: f64 = a["ttft_s"].parse().expect("TTFT recorded");
        let end: f64 = a["end_s"].parse::<f64>().unwrap() - a["start_s"].parse::<f64>().unwrap();
        assert!(ttft > 0.0 && ttft <= end, "{a:?}");
    }
    assert_eq!(o.metric("ok"), 3.0);
}

#[test]
fn databricks_wire_posts_to_invocations_without_a_model_field() {
    let ok = r#"{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Three sentences."},"finish_reason":"length"}],"usage":{"prompt_tokens":250,"completion_tokens":256,"total_tokens":506}}"#;
    let answer: &'static str = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{ok}",
            ok.len()
        )
        .into_boxed_str(),
    );
    let (url, seen) = fake(Some(answer));
    let target = format!("{url}/serving-endpoints");
    let o = replay(
        &target,
        "exp1-direct",
        2,
        &[
            "--wire",
            "databricks",
            "--model",
            "my-llm",
            "--token-env",
            "REPLAY_KEY",
        ],
    );
    assert_eq!(o.metric("ok"), 2.0);
    assert_eq!(o.metric("output_tokens"), 512.0);
    assert_eq!(
        o.metric("truncated"),
        2.0,
        "finish_reason length counts as cut by max_tokens"
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for (head, body) in seen.iter() {
        assert!(
            head.starts_with("POST /serving-endpoints/my-llm/invocations HTTP/1.1"),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains("authorization: bearer k"),
            "{head}"
        );
        let v: Value = serde_json::from_str(body).unwrap();
        assert!(v.get("model").is_none(), "{v}");
        assert_eq!(v["max_tokens"], 256);
    }
}

#[test]
fn the_timeout_ends_the_replay_and_keeps_every_row() {
    let (url, _) = fake(None);
    let o = replay(&url, "exp1-direct", 5, &["--timeout", "1000s"]);
    // 1000 model s at --time-scale 1000: one real second, then the attempts
    // in flight are cancelled and recorded
    assert_eq!(o.attempts.len(), 5);
    for a in &o.attempts {
        assert_eq!(a["error_kind"], "deadline", "{a:?}");
    }
    for r in &o.rows {
        assert_eq!(r["status"], "");
        assert!(r["error"].contains("--timeout"), "{r:?}");
    }
    assert_eq!(o.metric("rows_unfinished"), 5.0);
    assert_eq!(o.metric("total"), 0.0);
}

#[test]
fn prompts_from_a_rows_file_and_a_missing_column_exits_2_naming_it() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("reviews.csv");
    std::fs::write(
        &csv,
        "id,review\n1,\"Great food, slow service.\"\n2,Too salty\n3,Fine\n",
    )
    .unwrap();
    let (code, stdout, stderr) = qsim(
        &[
            "replay",
            EXP,
            "--target",
            "http://127.0.0.1:9",
            "--rows",
            csv.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert_eq!(
        stderr.trim(),
        format!(
            "qsim: {}: --prompt-column: no column \"prompt\"; the file has id, review",
            csv.display()
        )
    );
    let jsonl = dir.path().join("reviews.jsonl");
    std::fs::write(&jsonl, "{\"review\":\"a\"}\n{\"text\":\"b\"}\n").unwrap();
    let (code, _, stderr) = qsim(
        &[
            "replay",
            EXP,
            "--target",
            "http://127.0.0.1:9",
            "--rows",
            jsonl.to_str().unwrap(),
            "--prompt-column",
            "review",
        ],
        &[],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--prompt-column: no key \"review\" on line 2; it has text"),
        "{stderr}"
    );
    // the file's prompts are what is sent, one row each
    let (_p, url) = llmock(&[]);
    let o = replay(
        &url,
        "exp1-direct",
        3,
        &["--rows", csv.to_str().unwrap(), "--prompt-column", "review"],
    );
    assert_eq!(o.metric("ok"), 3.0);
    assert_eq!(o.attempts.len(), 3);
    // the same prompts from a Parquet file (written with qsim-results)
    let stem = dir.path().join("reviews");
    qsim_results::write_table(
        &stem,
        &[qsim_results::NamedColumn::new(
            "review",
            qsim_results::Values::Str(vec![
                Some("Great food, slow service.".into()),
                Some("Too salty".into()),
                Some("Fine".into()),
            ]),
        )],
    )
    .unwrap();
    let pq = stem.with_extension("parquet");
    let o = replay(
        &url,
        "exp1-direct",
        3,
        &["--rows", pq.to_str().unwrap(), "--prompt-column", "review"],
    );
    assert_eq!(o.metric("ok"), 3.0);
    let (code, _, stderr) = qsim(
        &[
            "replay",
            EXP,
            "--target",
            "http://127.0.0.1:9",
            "--rows",
            pq.to_str().unwrap(),
            "--prompt-column",
            "prompt",
        ],
        &[],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("prompt"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

#[test]
fn the_managed_executor_replays_through_its_aimd_window() {
    crate::live!();
    let (_p, url) = llmock(&[]);
    let o = replay(&url, "exp3-ai-query", 12, &[]);
    assert_eq!(o.metric("ok"), 12.0);
    assert_eq!(o.attempts.len(), 12);
    assert!(o.stdout.contains("managed"), "{}", o.stdout);
}

#[test]
fn a_target_off_this_machine_needs_yes_and_shows_the_budget_first() {
    let (code, stdout, stderr) = qsim(
        &[
            "replay",
            EXP,
            "--target",
            "https://example.invalid/serving-endpoints",
            "--wire",
            "databricks",
        ],
        &[],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("about to send to https://example.invalid/serving-endpoints/databricks-claude-haiku-4-5/invocations"), "{stderr}");
    assert!(
        stderr.contains("exp1-direct: 200 rows, 200..600 requests"),
        "{stderr}"
    );
    assert!(
        stderr.contains("exp2-backoff: 200 rows, 200..4800 requests"),
        "{stderr}"
    );
    assert!(stderr.contains("qsim: --yes: the target"), "{stderr}");
}

/// The peak RSS (VmHWM, kB) of a running `qsim` process, read until it
/// exits. Only once it runs `qsim`: between the spawn and the exec the
/// child shares the test process's memory (`posix_spawn` clones it with
/// `CLONE_VM`), whose high-water mark (this test's 100 MB answer, the
/// other tests' buffers) its status then shows; a busy machine widens that
/// window. A loaded full run (2026-12-03) failed on 376 MB, while this
/// test alone peaks at 31 MB: the test process holds ~300 MB at its peak
/// (the answer, built three times), the likely source.
fn peak_kb(child: &mut std::process::Child) -> u64 {
    let path = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        if let Ok(s) = std::fs::read_to_string(&path) {
            let execed = s
                .lines()
                .any(|l| l.strip_prefix("Name:").map(str::trim) == Some("qsim"));
            if let Some(v) = s
                .lines()
                .filter(|_| execed)
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak = peak.max(v);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    peak
}

#[test]
fn large_answers_are_streamed_not_buffered() {
    // two answers of 100 MB each (the message's content): the replay keeps
    // usage and finish_reason, never the answer (it held 320 MB)
    const MB: usize = 1 << 20;
    let content = "a".repeat(100 * MB);
    let body = format!(
        r#"{{"id":"x","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"{content}"}},"finish_reason":"length"}}],"usage":{{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}}}"#
    );
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    drop((content, body));
    let (url, _) = fake(Some(Box::leak(answer.into_boxed_str())));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut child = crate::common::qsim()
        .args(["replay", EXP, "--target", &url, "--only", "exp1-direct"])
        // time-scaled ×10 (the rows' pacing), bounds far beyond any machine's
        // speed: 100 MB over loopback took seconds on a busy one
        .args(["--set", "rows=2", "--time-scale", "10"])
        .args([
            "--attempt-timeout",
            "100000s",
            "--timeout",
            "100000s",
            "--out",
        ])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let peak = peak_kb(&mut child);
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let attempts = read_csv(&out.join("attempts.csv"));
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    for a in &attempts {
        assert_eq!(a["status"], "200", "{a:?}");
        assert_eq!(a["output_tokens"], "7", "{a:?}");
        assert_eq!(a["input_tokens"], "5", "{a:?}");
        assert_eq!(a["finish_reason"], "length", "{a:?}");
    }
    assert!(peak > 0, "qsim's status never read while it ran");
    assert!(
        peak < 100 * 1024,
        "peak RSS {} MB while reading two 100 MB answers",
        peak / 1024
    );
}
