//! The sans-IO model interface: a [`Backend`] answers generation requests
//! in model time (integer ns), emitting [`Event`]s for request ids. `qsim
//! serve` drives one in real time over HTTP (qsim-live's `serve`), the
//! proxy's drift shadow feeds it the forwarded load (qsim-live's `drift`),
//! and the root crate implements it for a hosted-API profile and for the
//! GPU server `Cluster` (and drives it in virtual time in its tests).

use crate::time::Nanos;

/// What the model is asked for, as the HTTP side parsed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenRequest {
    /// Estimated from the prompt (qsim-live's `estimate::input_tokens`).
    pub input_tokens: u64,
    /// `max_tokens` (or `max_completion_tokens`) if the request states it.
    pub max_tokens: Option<u64>,
    /// FNV-1a of the prompt's JSON text: the same prompt gets the same
    /// answer length (temperature 0), whatever else differs.
    pub prompt_hash: u64,
    /// The answer's length when it is already known (the proxy's drift
    /// shadow replays what the upstream produced); `None`: the model decides.
    pub output_tokens: Option<u64>,
}

/// Why an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The model stopped on its own.
    Stop,
    /// `max_tokens` cut it.
    Length,
}

impl Finish {
    /// The OpenAI `finish_reason`.
    pub fn name(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// Where a 429 carries its retry hint, with the model-time duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryHint {
    None,
    /// `Retry-After: <whole seconds>` header.
    RetryAfter(Nanos),
    /// `retry-after-ms: <whole ms>` header.
    RetryAfterMs(Nanos),
    /// `"retry_after": <seconds>` in the JSON body.
    BodyRetryAfter(Nanos),
}

/// A request the model refused (after its own delay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// 429: `limit` names the binding limit; `body` is the profile's body
    /// verbatim (a JSON object), if it gives one.
    RateLimited {
        limit: String,
        hint: RetryHint,
        body: Option<String>,
    },
    /// 500 (fault injection).
    ServerError,
}

/// What the model emits for a request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `n` more output tokens exist (the first marks the time to first token).
    Tokens { id: u64, n: u64 },
    /// The answer is complete (after every token).
    Done {
        id: u64,
        prompt_tokens: u64,
        completion_tokens: u64,
        finish: Finish,
    },
    /// Refused; nothing else follows.
    Failed { id: u64, failure: Failure },
}

impl Event {
    /// The request the event is for.
    pub fn id(&self) -> u64 {
        match self {
            Event::Tokens { id, .. } | Event::Done { id, .. } | Event::Failed { id, .. } => *id,
        }
    }
    /// Nothing follows this event for its request.
    pub fn terminal(&self) -> bool {
        !matches!(self, Event::Tokens { .. })
    }
}

/// A request that can never be answered: 400 with this code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub code: &'static str,
    pub message: String,
}

/// A sans-IO model answering generation requests in model time (ns).
pub trait Backend: Send + 'static {
    /// The model's name (`GET /v1/models`).
    fn name(&self) -> &str;
    /// A request arrives at `now` (the driver has advanced the model to
    /// `now` first). Events for any request may be pushed to `out`.
    fn submit(
        &mut self,
        now: Nanos,
        id: u64,
        req: &GenRequest,
        out: &mut Vec<Event>,
    ) -> Result<(), Invalid>;
    /// The next internal deadline.
    fn poll_timeout(&self) -> Option<Nanos>;
    /// Process everything due at or before `now`, in time order.
    fn handle_timeout(&mut self, now: Nanos, out: &mut Vec<Event>);
}
