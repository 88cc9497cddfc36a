//! Prometheus metrics (prometheus-client), served at `GET /metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumerLabel {
    pub consumer: Arc<String>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabel {
    pub consumer: Arc<String>,
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabel {
    pub consumer: Arc<String>,
    /// admitted | refused_deadline | refused_max_wait | expired | unavailable
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// idle (no byte of a request head) | headers (part of one) | body
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabel {
    pub upstream: Arc<String>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamResultLabel {
    pub upstream: Arc<String>,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<RouteLabel, Counter>,
    pub admitted: Family<ConsumerLabel, Counter>,
    pub rejected: Family<RejectLabel, Counter>,
    pub invalid: Family<ReasonLabel, Counter>,
    pub in_flight: Gauge,
    pub reserved_tokens: Gauge,
    pub settled_output_tokens: Family<ConsumerLabel, Counter>,
    pub upstream_status: Family<StatusLabel, Counter>,
    pub upstream_errors: Family<ReasonLabel, Counter>,
    pub state_unavailable: Family<ReasonLabel, Counter>,
    pub latency: Histogram,
    pub ttft: Histogram,
    pub waiting: Gauge,
    pub waits: Family<WaitLabel, Counter>,
    pub wait_seconds: Histogram,
    pub overhead: Histogram,
    pub reloads: Family<ResultLabel, Counter>,
    pub read_timeouts: Family<PhaseLabel, Counter>,
    pub generation: Gauge,
    pub upstream_attempts: Family<UpstreamResultLabel, Counter>,
    pub upstream_answered: Family<UpstreamLabel, Counter>,
    pub upstream_in_flight: Family<UpstreamLabel, Gauge>,
    pub upstream_cooldowns: Family<UpstreamLabel, Counter>,
    pub upstream_circuit_opened: Family<UpstreamLabel, Counter>,
    pub upstream_probes: Family<UpstreamResultLabel, Counter>,
    pub upstream_cooling_down: Family<UpstreamLabel, Gauge>,
    pub upstream_circuit: Family<UpstreamLabel, Gauge>,
    pub gateway_refused: Family<ReasonLabel, Counter>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("qsim_proxy");
        let m = Metrics {
            requests: Family::default(),
            admitted: Family::default(),
            rejected: Family::default(),
            invalid: Family::default(),
            in_flight: Gauge::default(),
            reserved_tokens: Gauge::default(),
            settled_output_tokens: Family::default(),
            upstream_status: Family::default(),
            upstream_errors: Family::default(),
            state_unavailable: Family::default(),
            latency: Histogram::new(exponential_buckets(0.0005, 2.0, 18)),
            ttft: Histogram::new(exponential_buckets(0.0005, 2.0, 18)),
            waiting: Gauge::default(),
            waits: Family::default(),
            wait_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 18)),
            // 10 µs to ~1.3 s
            overhead: Histogram::new(exponential_buckets(0.00001, 2.0, 18)),
            reloads: Family::default(),
            read_timeouts: Family::default(),
            generation: Gauge::default(),
            upstream_attempts: Family::default(),
            upstream_answered: Family::default(),
            upstream_in_flight: Family::default(),
            upstream_cooldowns: Family::default(),
            upstream_circuit_opened: Family::default(),
            upstream_probes: Family::default(),
            upstream_cooling_down: Family::default(),
            upstream_circuit: Family::default(),
            gateway_refused: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "overhead_seconds",
            "Time a request spends in the proxy's own code, from the handler's start to the moment it is forwarded (body read, JSON, token count, limiter decision; waits under on_limit = wait excluded) or answered with a 429",
            m.overhead.clone(),
        );
        registry.register(
            "requests",
            "Requests received, by route",
            m.requests.clone(),
        );
        registry.register(
            "admitted",
            "Requests admitted by the limiter, by consumer",
            m.admitted.clone(),
        );
        registry.register(
            "rejected",
            "Requests denied by the limiter, by consumer and limit",
            m.rejected.clone(),
        );
        registry.register(
            "invalid",
            "Requests refused before admission (bad input, unknown consumer), by reason",
            m.invalid.clone(),
        );
        registry.register(
            "in_flight",
            "Admitted requests not yet settled",
            m.in_flight.clone(),
        );
        registry.register(
            "reserved_tokens",
            "max_tokens reserved by admitted requests not yet settled",
            m.reserved_tokens.clone(),
        );
        registry.register(
            "settled_output_tokens",
            "Output tokens settled (upstream usage, or the streamed chunks seen when it never came)",
            m.settled_output_tokens.clone(),
        );
        registry.register(
            "upstream_status",
            "Upstream responses by HTTP status",
            m.upstream_status.clone(),
        );
        registry.register(
            "upstream_errors",
            "Upstream failures and client disconnects, by reason",
            m.upstream_errors.clone(),
        );
        registry.register(
            "state_unavailable",
            "Requests met while the shared limiter state was unreachable, by outcome (fail_open: forwarded unlimited; fail_closed: 503)",
            m.state_unavailable.clone(),
        );
        registry.register(
            "latency_seconds",
            "Admitted requests: from arrival to the end of the upstream's answer",
            m.latency.clone(),
        );
        registry.register(
            "ttft_seconds",
            "Admitted requests: from arrival to the first body bytes of the upstream's answer",
            m.ttft.clone(),
        );
        registry.register(
            "waiting",
            "Requests held by on_limit = \"wait\" right now",
            m.waiting.clone(),
        );
        registry.register(
            "waits",
            "Over-limit requests of waiting consumers, by consumer and outcome (admitted after a wait; refused at once because the predicted wait exceeds the deadline or max_wait; expired at the deadline; abandoned by the client)",
            m.waits.clone(),
        );
        registry.register(
            "wait_seconds",
            "Time held before admission, of waiting requests that were admitted",
            m.wait_seconds.clone(),
        );
        registry.register(
            "reloads",
            "Policy reloads on SIGHUP, by result (ok, error)",
            m.reloads.clone(),
        );
        registry.register(
            "read_timeouts",
            "Client connections closed because a request was not read in time, by phase (idle: no request head begun within header_read_timeout_s; headers: a request head begun but not finished within it; body: a request body not finished within body_read_timeout_s, answered 408)",
            m.read_timeouts.clone(),
        );
        registry.register(
            "policy_generation",
            "Generation of the policy in force (1 at start, +1 per successful reload)",
            m.generation.clone(),
        );
        registry.register(
            "upstream_attempts",
            "Attempts sent to each upstream, by its reply (ok, rate_limited, server_error, timeout, refused, client_error)",
            m.upstream_attempts.clone(),
        );
        registry.register(
            "upstream_answered",
            "Requests whose answer (any status) came from each upstream",
            m.upstream_answered.clone(),
        );
        registry.register(
            "upstream_in_flight",
            "Attempts sent to each upstream and not yet answered (a success until its answer ends)",
            m.upstream_in_flight.clone(),
        );
        registry.register(
            "upstream_cooldowns",
            "Cooldowns each upstream started (after a 429, or a 5xx, timeout or refused connection)",
            m.upstream_cooldowns.clone(),
        );
        registry.register(
            "upstream_circuit_opened",
            "Times each upstream's circuit breaker opened",
            m.upstream_circuit_opened.clone(),
        );
        registry.register(
            "upstream_probes",
            "Health probes of each upstream, by result (ok, failed)",
            m.upstream_probes.clone(),
        );
        registry.register(
            "upstream_cooling_down",
            "1 while an upstream cools down, else 0 (at the scrape)",
            m.upstream_cooling_down.clone(),
        );
        registry.register(
            "upstream_circuit",
            "Each upstream's circuit at the scrape: 0 closed, 1 open, 2 half-open",
            m.upstream_circuit.clone(),
        );
        registry.register(
            "gateway_refused",
            "Admitted requests no upstream could take, by reason (limited: at their own limits or cooling down after 429s; unavailable: failing or circuit open; no_route: no route for the model)",
            m.gateway_refused.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn encode(&self) -> String {
        let mut s = String::new();
        // writing into a String cannot fail
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}
