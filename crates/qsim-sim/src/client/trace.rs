//! One attempt of a caller as a driver saw it: what it sent, what came
//! back, and what the caller's state machine did next. The simulation
//! drivers report these to an observer (tests compare drivers with them).

use super::{Next, Reply};
use crate::time::Nanos;

/// One attempt (sent, or rejected locally by the adaptive throttle) and the
/// caller's answer to its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// The shared deployment's consumer; 0 in a hosted experiment.
    pub consumer: u32,
    /// The row (logical request), numbered in the order the driver started
    /// them (per consumer in a shared deployment).
    pub row: u64,
    /// Caller-level attempt number (1-based).
    pub attempt: u32,
    /// SDK retries already used within this caller-level attempt.
    pub sdk_retry: u32,
    /// When the attempt left (or was rejected locally).
    pub sent: Nanos,
    /// When its reply reached the caller.
    pub replied: Nanos,
    pub reply: Reply,
    /// The caller's answer: another attempt (by the SDK's hidden layer or
    /// its own policy) or done.
    pub next: Next,
}
