//! (qsim-live) One round trip through every driver's HTTP side: the benchmark client
//! (`bench.rs`) streams through a `qsim proxy` (`server.rs`, the handler,
//! the settlement's SSE scan) to a `qsim serve` endpoint (`serve.rs`) whose
//! model answers at once; then the proxy's limit answers a 429 whose retry
//! hint the one reader (`http::retry_hint`, through `qsim replay`) reads.

use qsim_core::client::{CallerPolicy, PoolShared, RetryPolicy};
use qsim_core::limiter::admission::{ConsumerPolicy, ConsumerSpec, LimiterConfig, Semantics, Unit};
use qsim_core::limiter::rates::OutputAccounting;
use qsim_core::model::{Backend, Event, Finish, GenRequest, Invalid};
use qsim_core::time::Nanos;
use qsim_live::replay::{Client, Options, Plan, Row, Target, Wire};
use qsim_live::{LimitShape, OnLimit, Proxy, ProxyConfig, StateBackend};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Answers every request at once with `max_tokens` (default 4) tokens.
struct Instant_;

impl Backend for Instant_ {
    fn name(&self) -> &str {
        "instant"
    }
    fn submit(
        &mut self,
        _now: Nanos,
        id: u64,
        req: &GenRequest,
        out: &mut Vec<Event>,
    ) -> Result<(), Invalid> {
        let n = req.max_tokens.unwrap_or(4);
        out.push(Event::Tokens { id, n });
        out.push(Event::Done {
            id,
            prompt_tokens: req.input_tokens,
            completion_tokens: n,
            finish: Finish::Length,
        });
        Ok(())
    }
    fn poll_timeout(&self) -> Option<Nanos> {
        None
    }
    fn handle_timeout(&mut self, _now: Nanos, _out: &mut Vec<Event>) {}
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

fn wait_listening(addr: SocketAddr) {
    let t = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{addr} never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn proxy_config(listen: SocketAddr, upstream: SocketAddr, rpm: Option<u64>) -> ProxyConfig {
    let policy = ConsumerPolicy {
        rpm,
        ..ConsumerPolicy::default()
    };
    ProxyConfig {
        listen,
        upstream: format!("http://{upstream}"),
        credential: None,
        consumer_header: None,
        keys: vec![("key-a".into(), 0)],
        unknown_consumer: Some(0),
        limit_shape: LimitShape::OpenAi,
        max_body_bytes: 1 << 20,
        default_max_tokens: 256,
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(30),
        upstream_timeout: Duration::from_secs(10),
        stream_idle_timeout: Duration::from_secs(10),
        lease: None,
        limiter: LimiterConfig {
            capacity: 100_000,
            unit: Unit::Rpm,
            threshold: 0.8,
            burst: None,
            semantics: Semantics::StrictFloors,
            accounting: OutputAccounting::ReserveRefund,
            consumers: vec![ConsumerSpec {
                name: "a".into(),
                reserved_bp: 0,
                policy,
            }],
        },
        threads: Some(1),
        state: StateBackend::InProcess,
        time_scale: 1.0,
        on_limit: vec![OnLimit::Reject],
        deadline_header: None,
        deadline_margin: Duration::ZERO,
        upstream_ca_file: None,
        upstream_ca_pem: None,
        drain_timeout: Duration::from_secs(1),
        log: None,
        drift: None,
    }
}

/// A `qsim serve` endpoint and a proxy in front of it (threads that live as
/// long as the test process); the proxy's address.
fn start(rpm: Option<u64>) -> SocketAddr {
    let model = free_addr();
    std::thread::spawn(move || {
        let cfg = qsim_live::serve::ServeConfig {
            listen: model,
            time_scale: 1.0,
        };
        qsim_live::serve::run(cfg, Instant_).expect("qsim serve");
    });
    wait_listening(model);
    let listen = free_addr();
    let proxy = Proxy::new(proxy_config(listen, model, rpm)).expect("a valid proxy");
    std::thread::spawn(move || proxy.run().expect("qsim proxy"));
    wait_listening(listen);
    listen
}

#[test]
fn bench_streams_through_the_proxy_to_qsim_serve() {
    let proxy = start(None);
    let cfg = qsim_live::bench::BenchConfig {
        target: format!("http://{proxy}"),
        model: "instant".into(),
        rate: 100.0,
        requests: (0..8).map(|i| (i as f64 * 0.01, 20, 5)).collect(),
        prompt: std::sync::Arc::new(|i, n| (0..n).map(|j| 1 + i as u32 + j).collect()),
        time_scale: 1.0,
        timeout: Duration::from_secs(20),
    };
    let r = qsim_live::bench::run(cfg).expect("the benchmark runs");
    assert_eq!(r["completed"], 8, "{r}");
    let lens: Vec<u64> = serde_json::from_value(r["output_lens"].clone()).unwrap();
    assert_eq!(lens, vec![5; 8], "usage read from the stream");
    let errors: Vec<String> = serde_json::from_value(r["errors"].clone()).unwrap();
    assert!(errors.iter().all(String::is_empty), "{errors:?}");
}

#[test]
fn replay_reads_the_proxys_retry_hint() {
    // one request a minute: the second of two rows is limited
    let proxy = start(Some(1));
    let target = Target {
        base: format!("http://{proxy}/v1"),
        wire: Wire::OpenAi,
        model: "instant".into(),
        token: Some("key-a".into()),
        stream: true,
    };
    let plan = Plan {
        name: "two".into(),
        client: Client::Pool {
            workers: 2,
            caller: CallerPolicy {
                retry: RetryPolicy::none(),
                sdk: None,
            },
            shared: PoolShared::default(),
        },
        max_tokens: 3,
        rows: (0..2)
            .map(|index| Row {
                index,
                prompt: "hello".into(),
            })
            .collect(),
    };
    let opts = Options {
        time_scale: 1.0,
        attempt_timeout: 10_000_000_000,
        // stop before any retry could be admitted (the hint is ~60 s)
        deadline: 3_000_000_000,
    };
    let mut rng = || 0.5;
    let run = qsim_live::replay::run(&target, &plan, opts, &mut rng).expect("the replay runs");
    let ok: Vec<_> = run
        .attempts
        .iter()
        .filter(|a| a.status == Some(200))
        .collect();
    let limited: Vec<_> = run
        .attempts
        .iter()
        .filter(|a| a.status == Some(429))
        .collect();
    assert_eq!(ok.len(), 1, "{:?}", run.attempts);
    assert_eq!(ok[0].output_tokens, Some(3));
    assert!(ok[0].ttft.is_some(), "TTFT from the SSE stream");
    assert!(!limited.is_empty(), "{:?}", run.attempts);
    for a in limited {
        let h = a.hint.expect("a 429 of the proxy carries retry-after-ms");
        assert!(h > 50_000_000_000 && h <= 60_000_000_000, "hint {h}");
        assert_eq!(h % 1_000_000, 0, "whole milliseconds as sent");
    }
}
