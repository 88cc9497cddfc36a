//! The proxy benchmark's two helpers (run by `benches/proxy.sh`; not a test):
//!
//! - `loadgen upstream PORT`: a fast local OpenAI-compatible upstream — a
//!   tiny hyper server answering every request with a fixed chat completion
//!   (with `usage`), on one thread;
//! - `loadgen load --target URL[,URL…] --conns C --secs S [--rate R] [--key K]
//!   [--threads T] [--header NAME:VALUE] [--per-target]`: keep-alive HTTP/1.1
//!   connections spread over the targets (connection i to target i mod n)
//!   sending `POST /v1/chat/completions`, closed loop (as fast as answers
//!   come) or open loop at `R` requests/s in total (each connection sends at
//!   its share of the rate; latency measured from the scheduled send time, so
//!   queueing is counted). Prints one JSON line: requests, req/s, statuses,
//!   latency p50/p90/p99/max in ms, and the 429 answers' alone (from their
//!   actual send time). With `--per-target`, one such line per target (with
//!   its `target`): the paired measurement of the added latency sends to the
//!   upstream and to the proxy in alternation from the same generator, so
//!   both see the same machine at the same moments.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::{Duration, Instant};

const ANSWER: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}"#;

const BODY: &str =
    r#"{"model":"bench","messages":[{"role":"user","content":"Say ok"}],"max_tokens":8}"#;

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.as_str())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(|s| s.as_str()) {
        Some("upstream") => {
            let port: u16 = args.get(2).and_then(|p| p.parse().ok()).expect("PORT");
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(upstream(port));
        }
        Some("load") => {
            let threads: usize = arg(&args, "--threads").map_or(1, |t| t.parse().unwrap());
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(load(&args));
        }
        _ => {
            eprintln!("usage: loadgen upstream PORT | loadgen load --target URL[,URL] --conns C --secs S [--rate R] [--key K] [--threads T]");
            std::process::exit(2);
        }
    }
}

async fn upstream(port: u16) {
    let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    println!("upstream listening on 127.0.0.1:{port}");
    loop {
        let Ok((s, _)) = l.accept().await else {
            continue;
        };
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    let mut r = Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
                    r.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, Infallible>(r)
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(s), svc)
                .await;
        });
    }
}

struct Out {
    lat_us: Vec<u64>,
    /// From the actual send (without the generator's own lateness: tokio's
    /// timer wakes a scheduled send up to a millisecond late)
    sent_us: Vec<u64>,
    lat_429_us: Vec<u64>,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
}

async fn conn_loop(
    addr: String,
    key: String,
    header: Option<(String, String)>,
    start: Instant,
    end: Instant,
    interval: Option<Duration>,
    offset: Duration,
) -> Out {
    let mut out = Out {
        lat_us: Vec::new(),
        sent_us: Vec::new(),
        lat_429_us: Vec::new(),
        statuses: BTreeMap::new(),
        errors: 0,
    };
    let mut next = start + offset;
    'outer: while Instant::now() < end {
        let Ok(s) = tokio::net::TcpStream::connect(&addr).await else {
            out.errors += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = s.set_nodelay(true);
        let Ok((mut tx, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await
        else {
            out.errors += 1;
            continue;
        };
        tokio::spawn(conn);
        loop {
            let sent = match interval {
                Some(iv) => {
                    tokio::time::sleep_until(next.into()).await;
                    let at = next;
                    next += iv;
                    at
                }
                None => Instant::now(),
            };
            if sent >= end {
                break 'outer;
            }
            if tx.ready().await.is_err() {
                out.errors += 1;
                continue 'outer;
            }
            let mut req = Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("host", addr.as_str())
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {key}"));
            if let Some((k, v)) = &header {
                req = req.header(k.as_str(), v.as_str());
            }
            let req = req
                .body(Full::new(Bytes::from_static(BODY.as_bytes())))
                .unwrap();
            let actual = Instant::now();
            match tx.send_request(req).await {
                Ok(r) => {
                    let st = r.status().as_u16();
                    if r.into_body().collect().await.is_err() {
                        out.errors += 1;
                        continue 'outer;
                    }
                    let us = sent.elapsed().as_micros() as u64;
                    out.lat_us.push(us);
                    out.sent_us.push(actual.elapsed().as_micros() as u64);
                    if st == 429 {
                        // from the actual send: a connection held by a
                        // waiting request sends its next ones late
                        out.lat_429_us.push(actual.elapsed().as_micros() as u64);
                    }
                    *out.statuses.entry(st).or_default() += 1;
                }
                Err(_) => {
                    out.errors += 1;
                    continue 'outer;
                }
            }
        }
    }
    out
}

async fn load(args: &[String]) {
    let targets: Vec<String> = arg(args, "--target")
        .expect("--target")
        .split(',')
        .map(|t| {
            t.trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string()
        })
        .collect();
    let conns: usize = arg(args, "--conns").map_or(32, |c| c.parse().unwrap());
    let secs: f64 = arg(args, "--secs").map_or(5.0, |c| c.parse().unwrap());
    let rate: Option<f64> = arg(args, "--rate").map(|r| r.parse().unwrap());
    let key = arg(args, "--key").unwrap_or("bench").to_string();
    let header = arg(args, "--header").map(|h| {
        let (k, v) = h.split_once(':').expect("--header NAME:VALUE");
        (k.trim().to_string(), v.trim().to_string())
    });
    let per_target = args.iter().any(|a| a == "--per-target");
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + Duration::from_secs_f64(secs);
    let interval = rate.map(|r| Duration::from_secs_f64(conns as f64 / r));
    let hs: Vec<_> = (0..conns)
        .map(|i| {
            let offset = interval.map_or(Duration::ZERO, |iv| iv.mul_f64(i as f64 / conns as f64));
            tokio::spawn(conn_loop(
                targets[i % targets.len()].clone(),
                key.clone(),
                header.clone(),
                start,
                end,
                interval,
                offset,
            ))
        })
        .collect();
    let took = |_: ()| (Instant::now().min(end + Duration::from_secs(5)) - start).as_secs_f64();
    let mut outs = Vec::new();
    for h in hs {
        outs.push(h.await.unwrap());
    }
    let took = took(());
    if per_target {
        // one line per target, each over the connections it had (i % n)
        for (t, name) in targets.iter().enumerate() {
            let mine = outs
                .iter()
                .enumerate()
                .filter(|(i, _)| i % targets.len() == t)
                .map(|(_, o)| o);
            println!("{}", summary(mine, took, secs, Some(name)));
        }
    } else {
        println!("{}", summary(outs.iter(), took, secs, None));
    }
}

fn summary<'a>(
    outs: impl Iterator<Item = &'a Out>,
    took: f64,
    secs: f64,
    target: Option<&str>,
) -> String {
    let mut lat = Vec::new();
    let mut sent = Vec::new();
    let mut lat429 = Vec::new();
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    let mut errors = 0;
    for o in outs {
        lat.extend_from_slice(&o.lat_us);
        sent.extend_from_slice(&o.sent_us);
        lat429.extend_from_slice(&o.lat_429_us);
        for (k, v) in &o.statuses {
            *statuses.entry(*k).or_default() += v;
        }
        errors += o.errors;
    }
    lat.sort_unstable();
    sent.sort_unstable();
    lat429.sort_unstable();
    let quantile = |lat: &[u64], p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1] as f64 / 1e3
        }
    };
    let q = |p: f64| quantile(&lat, p);
    let q429 = |p: f64| quantile(&lat429, p);
    let qs = |p: f64| quantile(&sent, p);
    let st: Vec<String> = statuses
        .iter()
        .map(|(k, v)| format!("\"{k}\":{v}"))
        .collect();
    let target = target.map_or(String::new(), |t| format!("\"target\":\"{t}\","));
    format!(
        "{{{target}\"requests\":{},\"rps\":{:.0},\"statuses\":{{{}}},\"errors\":{errors},\"p50_ms\":{:.3},\"p90_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3},\"p50_sent_ms\":{:.3},\"p99_sent_ms\":{:.3},\"p50_429_ms\":{:.3},\"p99_429_ms\":{:.3},\"max_429_ms\":{:.3}}}",
        lat.len(),
        lat.len() as f64 / took.max(secs),
        st.join(","),
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0),
        qs(0.5),
        qs(0.99),
        q429(0.5),
        q429(0.99),
        q429(1.0)
    )
}
