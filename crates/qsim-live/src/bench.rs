//! An open-loop streaming benchmark client in the manner of vLLM's
//! `benchmarks/benchmark_serving.py` (backend "openai"): one streaming
//! `POST /v1/completions` per request, sent at given arrival times whatever
//! the answers do, and its `--save-result` JSON (the summary means, medians
//! and p99s, and the per-request `input_lens`, `output_lens`, `ttfts`,
//! `itls`, `errors`). `qsim calibrate server` reads that JSON.
//!
//! As benchmark_serving: TTFT is from just before the request is sent to
//! the first chunk with text; ITL is every gap between chunks with text
//! after it; E2E (latency) is from the send to the last such chunk; the
//! output length is the answer's `usage.completion_tokens` (asked for with
//! `stream_options.include_usage`). The prompt is a list of token ids, so
//! an OpenAI-compatible server counts exactly the input length asked; each
//! request's ids come from [`BenchConfig::prompt`] (the caller's seeded
//! draws), so no two prompts share a prefix and a server's prefix cache
//! cannot hide the prefill the benchmark measures.
//!
//! A server may close a keep-alive connection just as the next request is
//! sent on it (llama.cpp's server closes one after each streamed answer).
//! A request that fails that way, before any byte of an answer, is sent
//! again, up to [`http::RESENDS`] times ([`http::send`]); its times still
//! start at the first send. `retries` in the result counts the resends.
//!
//! Beyond benchmark_serving's fields, `arrival_s` holds each request's send
//! time (model seconds from the start of the timed run): `qsim calibrate
//! server` then replays the very arrivals the server saw rather than
//! Poisson streams at the rate (40 Poisson arrivals are a noisy sample of
//! their rate: near saturation one draw's mean TTFT can be twice another's).
//!
//! Times: `time_scale` X is the server's `--time-scale` (the server runs X
//! times faster than real time): arrivals are sent at model time / X, and
//! durations are read on the same clock in model time (`clock.rs`: real
//! time × X), reported in model seconds.

use crate::clock::Clock;
use crate::http::{self, HttpClient};
use crate::sse;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use qsim_core::stats::{quantile, sorted};
use qsim_core::time::Nanos;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// What to send.
#[derive(Clone)]
pub struct BenchConfig {
    /// Base URL, e.g. http://127.0.0.1:8000.
    pub target: String,
    /// The model name sent.
    pub model: String,
    /// The offered rate (model requests/s), recorded as `request_rate`.
    pub rate: f64,
    /// Per request: (arrival in model seconds from the start, input tokens, max_tokens).
    pub requests: Vec<(f64, u32, u32)>,
    /// The prompt's token ids of request `i` with `n` input tokens
    /// (`i == requests.len()` is the initial test request).
    pub prompt: Arc<dyn Fn(usize, u32) -> Vec<u32> + Send + Sync>,
    pub time_scale: f64,
    /// Real-time limit of one request.
    pub timeout: Duration,
}

#[derive(Debug, Clone, Default)]
struct Out {
    ok: bool,
    ttft: f64,
    itl: Vec<f64>,
    latency: f64,
    output: u64,
    error: String,
    retries: u32,
    /// When it was sent (model seconds on the benchmark's clock).
    sent: f64,
}

/// One streamed request; times read on `clock` (model time).
async fn one(client: &HttpClient, url: &str, body: Bytes, clock: Clock, timeout: Duration) -> Out {
    let mut o = Out::default();
    // built once: `http::send` copies it for a resend
    let req = match Request::builder()
        .method(Method::POST)
        .uri(url)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
    {
        Ok(r) => r,
        Err(e) => {
            o.error = format!("bad request: {e}");
            return o;
        }
    };
    let st = clock.now();
    o.sent = secs(st);
    let mut last = st;
    let mut first = None;
    let mut usage = None;
    let mut retries = 0;
    let fut = async {
        // a pooled connection the server had closed: sent again (`http::send`)
        let (resp, resent) = http::send(client, req).await;
        retries = resent;
        let resp = resp.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        if status != 200 {
            let b = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let t: String = String::from_utf8_lossy(&b).chars().take(200).collect();
            return Err(format!("HTTP {status}: {t}"));
        }
        let mut lines = sse::Reader::default();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("reading the stream: {e}"))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let now = clock.now();
            lines.push(&data);
            while let Some(d) = lines.next_data() {
                let sse::Data::Event(d) = d else {
                    continue;
                };
                let v: Value = serde_json::from_slice(d).map_err(|e| format!("bad chunk: {e}"))?;
                if v.get("error").is_some() {
                    return Err(format!(
                        "error in the stream: {}",
                        String::from_utf8_lossy(d)
                    ));
                }
                let text = v
                    .pointer("/choices/0/text")
                    .and_then(Value::as_str)
                    .is_some_and(|t| !t.is_empty());
                if text {
                    match first {
                        None => first = Some(now),
                        Some(_) => o.itl.push(secs(now - last)),
                    }
                    last = now;
                }
                if let Some(n) = v
                    .pointer("/usage/completion_tokens")
                    .and_then(Value::as_u64)
                {
                    usage = Some(n);
                }
            }
        }
        Ok::<(), String>(())
    };
    let done = tokio::time::timeout(timeout, fut).await;
    o.retries = retries;
    match done {
        Ok(Ok(())) => match first {
            Some(f) => {
                o.ok = true;
                o.ttft = secs(f - st);
                o.latency = secs(last - st);
                o.output = usage.unwrap_or(o.itl.len() as u64 + 1);
            }
            None => o.error = "no token in the answer".into(),
        },
        Ok(Err(e)) => o.error = e,
        Err(_) => o.error = format!("no complete answer within {timeout:?}"),
    }
    if !o.ok {
        o.itl.clear();
    }
    o
}

/// Model nanoseconds in seconds.
fn secs(ns: Nanos) -> f64 {
    ns as f64 / 1e9
}

fn stats(xs: &[f64]) -> (f64, f64, f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0, 0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    // numpy's default (linear) percentile: the workspace's one quantile
    let s = sorted(xs);
    (mean, quantile(&s, 0.5), std, quantile(&s, 0.99))
}

/// Run the benchmark; returns benchmark_serving's result JSON.
pub fn run(cfg: BenchConfig) -> Result<Value, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(run_async(cfg))
}

async fn run_async(cfg: BenchConfig) -> Result<Value, String> {
    if cfg.requests.is_empty() {
        return Err("no request to send".into());
    }
    let client = http::client(&cfg.target, None)?;
    let url = format!("{}/v1/completions", cfg.target.trim_end_matches('/'));
    let body = |i: usize, input: u32, out: u32| -> Bytes {
        let prompt = (cfg.prompt)(i, input.max(1));
        Bytes::from(
            json!({"model": cfg.model, "prompt": prompt, "max_tokens": out, "temperature": 0.0,
                "stream": true, "stream_options": {"include_usage": true}})
            .to_string(),
        )
    };
    let x = cfg.time_scale;
    // the initial single-prompt test run (as benchmark_serving does)
    let t = one(
        &client,
        &url,
        body(cfg.requests.len(), cfg.requests[0].1, 2),
        Clock::new(0, x),
        cfg.timeout,
    )
    .await;
    if !t.ok {
        return Err(format!("the initial test request failed: {}", t.error));
    }
    let client = Arc::new(client);
    let url = Arc::new(url);
    let clock = Clock::new(0, x);
    let mut tasks = Vec::with_capacity(cfg.requests.len());
    for (i, &(at, input, out)) in cfg.requests.iter().enumerate() {
        let at = (at.max(0.0) * 1e9).min(Nanos::MAX as f64) as Nanos;
        tokio::time::sleep_until(clock.instant_at(at)).await;
        let (c, u, b) = (client.clone(), url.clone(), body(i, input, out));
        let timeout = cfg.timeout;
        tasks.push(tokio::spawn(
            async move { one(&c, &u, b, clock, timeout).await },
        ));
    }
    let mut outs = Vec::with_capacity(tasks.len());
    for t in tasks {
        outs.push(t.await.map_err(|e| e.to_string())?);
    }
    let dur = secs(clock.now());
    let good: Vec<(&Out, u32)> = outs
        .iter()
        .zip(&cfg.requests)
        .filter(|(o, _)| o.ok)
        .map(|(o, r)| (o, r.1))
        .collect();
    let completed = good.len();
    let tin: u64 = good.iter().map(|(_, i)| *i as u64).sum();
    let tout: u64 = good.iter().map(|(o, _)| o.output).sum();
    let ttfts: Vec<f64> = good.iter().map(|(o, _)| o.ttft).collect();
    let itls: Vec<f64> = good
        .iter()
        .flat_map(|(o, _)| o.itl.iter().copied())
        .collect();
    let e2els: Vec<f64> = good.iter().map(|(o, _)| o.latency).collect();
    let tpots: Vec<f64> = good
        .iter()
        .filter(|(o, _)| o.output > 1)
        .map(|(o, _)| (o.latency - o.ttft) / (o.output - 1) as f64)
        .collect();
    let mut r = json!({
        "backend": "openai",
        "model_id": cfg.model,
        "num_prompts": cfg.requests.len(),
        "request_rate": cfg.rate,
        "burstiness": 1.0,
        "max_concurrency": null,
        "duration": dur,
        "completed": completed,
        "total_input_tokens": tin,
        "total_output_tokens": tout,
        "request_throughput": completed as f64 / dur,
        "output_throughput": tout as f64 / dur,
        "total_token_throughput": (tin + tout) as f64 / dur,
        "input_lens": cfg.requests.iter().map(|r| r.1).collect::<Vec<_>>(),
        "output_lens": outs.iter().map(|o| if o.ok { o.output } else { 0 }).collect::<Vec<_>>(),
        "ttfts": outs.iter().map(|o| o.ttft).collect::<Vec<_>>(),
        "itls": outs.iter().map(|o| o.itl.clone()).collect::<Vec<_>>(),
        "generated_texts": outs.iter().map(|_| "").collect::<Vec<_>>(),
        "errors": outs.iter().map(|o| o.error.clone()).collect::<Vec<_>>(),
        // not in benchmark_serving's file: each request's send time, so
        // `qsim calibrate server` replays the arrivals the server saw
        "arrival_s": outs.iter().map(|o| o.sent).collect::<Vec<_>>(),
        "retries": outs.iter().map(|o| o.retries as u64).sum::<u64>(),
    });
    for (k, xs) in [
        ("ttft", &ttfts),
        ("tpot", &tpots),
        ("itl", &itls),
        ("e2el", &e2els),
    ] {
        let (mean, median, std, p99) = stats(xs);
        r[format!("mean_{k}_ms")] = json!(mean * 1e3);
        r[format!("median_{k}_ms")] = json!(median * 1e3);
        r[format!("std_{k}_ms")] = json!(std * 1e3);
        r[format!("p99_{k}_ms")] = json!(p99 * 1e3);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Reads one HTTP/1.1 request (head and content-length body); false at EOF.
    fn read_request(r: &mut BufReader<std::net::TcpStream>) -> bool {
        let mut len = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return false;
            }
            let l = line.trim_end().to_ascii_lowercase();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).is_ok()
    }

    #[test]
    fn a_request_on_connections_the_server_closed_is_sent_again() {
        // The server answers the first request of its first connection and
        // then reads the next one and closes without answering, as a server
        // closing an idle keep-alive connection under an outgoing request
        // does; its second connection closes on its first request the
        // same way (the request sent again meets a closed one again); every
        // other connection answers everything.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let dropped = Arc::new(AtomicU32::new(0));
        let d = dropped.clone();
        std::thread::spawn(move || {
            for (k, s) in l.incoming().enumerate() {
                let s = s.unwrap();
                let d = d.clone();
                std::thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    let mut served = 0;
                    while read_request(&mut r) {
                        if (k == 0 && served == 1) || k == 1 {
                            d.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        let body = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n\
                            data: {\"choices\":[{\"text\":\"b\"}],\"usage\":{\"completion_tokens\":2}}\n\n\
                            data: [DONE]\n\n";
                        write!(
                            w,
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        )
                        .unwrap();
                        served += 1;
                    }
                });
            }
        });
        let r = run(BenchConfig {
            target: format!("http://{addr}"),
            model: "m".into(),
            rate: 10.0,
            requests: vec![(0.0, 4, 2), (0.2, 4, 2), (0.4, 4, 2)],
            prompt: Arc::new(|i, n| (0..n).map(|j| 1 + i as u32 + j).collect()),
            time_scale: 1.0,
            timeout: Duration::from_secs(20),
        })
        .unwrap();
        assert_eq!(dropped.load(Ordering::SeqCst), 2, "the server dropped two");
        assert_eq!(r["completed"], 3, "{r}");
        assert_eq!(r["retries"], 2, "{r}");
        assert_eq!(r["output_lens"], serde_json::json!([2, 2, 2]), "{r}");
    }
}
