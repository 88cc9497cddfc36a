//! Settlement of an admitted request, whatever happens to it.
//!
//! [`Settle`] is a drop guard holding the limiter's `Grant`: dropping it
//! calls `complete` exactly once, with the upstream's `usage` if one was
//! seen, else the output observed so far (streamed chunks with content, ~one
//! token each; 0 when the upstream failed before answering). So a request
//! that ends in any way — normal end, upstream error, timeout, stall, the
//! client going away (hyper drops the handler future or the response body) —
//! returns its concurrency slot and its unused reservation.
//!
//! [`Tracked`] wraps the upstream's response body: frames are passed on as
//! they arrive (no buffering), scanned on the side for the usage (the JSON
//! body, or the SSE chunk carrying `usage`), and the guard is dropped at the
//! end of the stream.

use crate::app::{App, Gen, Local, Store};
use crate::drift::Track;
use crate::http::BoxError;
use crate::metrics::ReasonLabel;
use crate::record::Record;
use crate::sse;
use crate::sync::lock;
use bytes::Bytes;
use http_body::{Body, Frame};
use hyper::body::Incoming;
use qsim_core::limiter::admission::{complete, translate_grant, Grant};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::time::Sleep;

pub struct Settle {
    pub app: Arc<App>,
    /// The policy generation the grant was made under.
    gen: Arc<Gen>,
    /// `None`: forwarded without a decision (shared state down, fail open).
    grant: Option<Grant>,
    /// The request id (in logs).
    pub id: u64,
    arrived: Instant,
    /// `usage.completion_tokens` from the upstream.
    pub usage: Option<u64>,
    /// Output seen so far without a usage (streamed content chunks).
    pub partial: u64,
    pub first_byte: bool,
    /// The decision log's record (when the log is on), completed and
    /// handed to the log writer when the request is settled.
    pub rec: Option<Box<Record>>,
    /// The core's time of the admission decision.
    pub decided: qsim_core::time::Nanos,
    /// Set when the request is sent upstream if `--profile` is on (drift.rs).
    pub drift: Option<Track>,
}

impl Settle {
    pub fn new(
        app: Arc<App>,
        gen: Arc<Gen>,
        grant: Option<Grant>,
        arrived: Instant,
        id: u64,
    ) -> Settle {
        app.metrics.in_flight.inc();
        if let Some(g) = &grant {
            app.metrics.reserved_tokens.inc_by(g.max_tokens as i64);
        }
        Settle {
            app,
            gen,
            grant,
            id,
            arrived,
            usage: None,
            partial: 0,
            first_byte: false,
            drift: None,
            rec: None,
            decided: 0,
        }
    }
    fn note_prompt_tokens(&mut self, v: &serde_json::Value) {
        if let Some(r) = self.rec.as_mut() {
            r.usage_input = v
                .get("usage")
                .and_then(|u| u.get("prompt_tokens"))
                .and_then(|n| n.as_u64());
        }
    }
    pub fn has_grant(&self) -> bool {
        self.grant.is_some()
    }
    fn on_first_byte(&mut self) {
        if !self.first_byte {
            self.first_byte = true;
            if let Some(t) = &mut self.drift {
                t.first = Some(self.app.now());
            }
            self.app
                .metrics
                .ttft
                .observe(self.arrived.elapsed().as_secs_f64());
            if let Some(r) = self.rec.as_mut() {
                r.ttft_ns = Some(self.app.now().saturating_sub(r.arrival_ns));
            }
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        let out = self.usage.unwrap_or(self.partial);
        let app = &self.app;
        if let (Some(d), Some(t)) = (&app.drift, &self.drift) {
            d.end_request(self.id, t, app.now(), out);
        }
        let m = &app.metrics;
        m.in_flight.dec();
        m.latency.observe(self.arrived.elapsed().as_secs_f64());
        if let (Some(mut r), Some(log)) = (self.rec.take(), app.log.as_ref()) {
            r.end_ns = Some(app.now());
            r.settled_output = self.grant.map(|_| out);
            r.usage_output = self.usage;
            log.push(r);
        }
        let Some(grant) = self.grant else {
            return;
        };
        match &app.store {
            Store::Local(st) => {
                let mut l = lock(st);
                let now = app.now();
                let Local { gen, state } = &mut *l;
                if Arc::ptr_eq(&gen.params, &self.gen.params) {
                    complete(&gen.params, state, now, &grant, out);
                } else if let Some(g) = translate_grant(&self.gen.params, &gen.params, &grant) {
                    // admitted before a reload: settled on the new state
                    complete(&gen.params, state, now, &g, out);
                }
            }
            Store::Redis(_) => {
                // the shared state is written asynchronously; if it cannot be,
                // the lease and the reservation expire on their own (conservative)
                let a = app.clone();
                let gen = self.gen.clone();
                let id = self.id;
                let task = async move {
                    if let Store::Redis(r) = &a.store {
                        if let Err(e) = r.complete(&gen.params, &|| a.now(), &grant, out).await {
                            tracing::warn!(id, error = %e, consumer = %gen.names[grant.consumer],
                                "completion not written to the shared state (its lease expires on its own)");
                        }
                    }
                    a.pending_writes.fetch_sub(1, Ordering::AcqRel);
                    a.waits.wake_heads();
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(h) => {
                        app.pending_writes.fetch_add(1, Ordering::AcqRel);
                        h.spawn(task);
                    }
                    Err(_) => tracing::warn!(
                        id = self.id,
                        "completion dropped: no runtime (shutting down)"
                    ),
                }
            }
        }
        // capacity or a slot may have freed up before the waiters' retry times
        app.waits.wake_heads();
        m.reserved_tokens.dec_by(grant.max_tokens as i64);
        m.settled_output_tokens
            .get_or_create(&app.consumer_label(&self.gen, grant.consumer))
            .inc_by(out);
        tracing::debug!(
            id = self.id,
            consumer = %self.gen.names[grant.consumer],
            output_tokens = out,
            from_usage = self.usage.is_some(),
            "settled"
        );
    }
}

/// What the body is scanned for.
enum Scan {
    /// An error answer: nothing to settle but 0.
    Nothing,
    /// A JSON body, kept (up to a cap) until its end to read `usage`.
    Json(Vec<u8>),
    /// An SSE stream, split into its data lines.
    Sse(sse::Reader),
}

const JSON_CAP: usize = 16 << 20;

/// `usage.completion_tokens` of a JSON value.
fn completion_tokens(v: &serde_json::Value) -> Option<u64> {
    v.get("usage")?.get("completion_tokens")?.as_u64()
}

pub struct Tracked {
    inner: Incoming,
    guard: Option<Settle>,
    scan: Scan,
    idle: Duration,
    sleep: Pin<Box<Sleep>>,
    /// The SSE stream's `data: [DONE]` was seen: a client leaving after it
    /// (SDKs stop reading there) has had the whole answer.
    done: bool,
}

impl Tracked {
    pub fn new(inner: Incoming, guard: Settle, ok: bool, sse: bool, idle: Duration) -> Tracked {
        let scan = match (ok, sse) {
            (false, _) => Scan::Nothing,
            (true, true) => Scan::Sse(sse::Reader::default()),
            (true, false) => Scan::Json(Vec::new()),
        };
        Tracked {
            inner,
            guard: Some(guard),
            scan,
            idle,
            sleep: Box::pin(tokio::time::sleep(idle)),
            done: false,
        }
    }

    fn feed(&mut self, d: &Bytes) {
        let Some(g) = self.guard.as_mut() else {
            return;
        };
        g.on_first_byte();
        match &mut self.scan {
            Scan::Nothing => {}
            Scan::Json(buf) => {
                if buf.len() + d.len() <= JSON_CAP {
                    buf.extend_from_slice(d);
                }
            }
            Scan::Sse(r) => {
                r.push(d);
                while let Some(data) = r.next_data() {
                    let data = match data {
                        sse::Data::Done => {
                            self.done = true;
                            continue;
                        }
                        sse::Data::Event(data) => data,
                    };
                    // only chunks that mention usage are parsed; the rest
                    // count as ~one output token each if they carry content
                    if memchr(data, b"\"usage\"") {
                        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
                            if let Some(n) = completion_tokens(&v) {
                                g.usage = Some(n);
                                g.note_prompt_tokens(&v);
                                continue;
                            }
                        }
                    }
                    if memchr(data, b"\"content\"") || memchr(data, b"\"text\"") {
                        g.partial += 1;
                    }
                }
            }
        }
    }

    fn finish(&mut self) {
        if let (Scan::Json(buf), Some(g)) = (&self.scan, self.guard.as_mut()) {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(buf) {
                g.usage = completion_tokens(&v);
                g.note_prompt_tokens(&v);
            }
        }
        self.guard = None;
    }

    fn fail(&mut self, reason: &'static str) {
        if let Some(g) = &self.guard {
            g.app
                .metrics
                .upstream_errors
                .get_or_create(&ReasonLabel {
                    reason: reason.into(),
                })
                .inc();
            tracing::warn!(id = g.id, reason, "response ended early");
        }
        if let Some(r) = self.guard.as_mut().and_then(|g| g.rec.as_mut()) {
            r.error = Some(reason.into());
        }
        self.guard = None;
    }
}

fn memchr(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if self.guard.is_some() {
            if self.done || self.inner.is_end_stream() {
                self.finish();
            } else if self
                .guard
                .as_ref()
                .is_some_and(|g| g.app.cut.load(std::sync::atomic::Ordering::Acquire))
            {
                // the proxy's drain timeout cut the answer
                self.fail("drain_timeout");
            } else {
                // the client went away before the end of the answer
                self.fail("client_disconnect");
            }
        }
    }
}

#[derive(Debug)]
struct Stalled(Duration);

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "upstream sent nothing for {:?}", self.0)
    }
}
impl std::error::Error for Stalled {}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.feed(d);
                }
                // hyper stops polling once a sized body is complete
                if this.inner.is_end_stream() {
                    this.finish();
                }
                let deadline = tokio::time::Instant::now() + this.idle;
                this.sleep.as_mut().reset(deadline);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.fail("upstream_body");
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Pending if this.guard.is_none() => Poll::Pending,
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.fail("upstream_stalled");
                    Poll::Ready(Some(Err(Box::new(Stalled(this.idle)))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}
