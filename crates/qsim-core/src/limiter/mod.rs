//! Admission limiting: token buckets, provider rate limits and the
//! consumer-aware admission limiter built on them.
//! Sans-IO: every call takes `now`; nothing here reads a clock.

pub mod admission;
pub mod bucket;
pub mod rates;
pub mod wait;

pub use admission::{
    Decision, Grant, Limit, Limiter, LimiterConfig, Params, Semantics, State, Unit,
};
pub use bucket::{BucketSpec, TokenBucket};
