//! Client-side models: retry policies, the SDK's hidden retry layer,
//! client-side throttles (AWS retry quota, Google SRE adaptive throttling),
//! the managed batch executor's adaptive concurrency controller, and the
//! caller state machine ([`caller`]) that combines them.

pub mod caller;
pub mod managed;
pub mod policy;
pub mod throttle;

pub use caller::{
    Call, CallerPolicy, Layer, Managed, ManagedNext, Next, Outcome, PoolShared, Reply, Send,
};
pub use managed::AimdController;
pub use policy::{Backoff, RetryPolicy, SdkRetry, StatusSet};
pub use throttle::{AdaptiveThrottle, RetryQuota};
