//! Client-side models: retry policies, the SDK's hidden retry layer,
//! client-side throttles (AWS retry quota, Google SRE adaptive throttling),
//! and the managed batch executor's adaptive concurrency controller.

pub mod managed;
pub mod policy;
pub mod throttle;

pub use managed::AimdController;
pub use policy::{Backoff, RetryPolicy, SdkRetry, StatusSet};
pub use throttle::{AdaptiveThrottle, RetryQuota};
