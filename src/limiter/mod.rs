//! Admission limiting: token buckets and the rate-limit rules built on them.
//! Sans-IO: every call takes `now`; nothing here reads a clock.

pub mod bucket;
pub mod rates;

pub use bucket::TokenBucket;
