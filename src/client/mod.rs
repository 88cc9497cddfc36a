//! Client-side models: retry policies, the SDK's hidden retry layer, and the
//! managed batch executor's adaptive concurrency controller.

pub mod managed;
pub mod policy;

pub use managed::AimdController;
pub use policy::{Backoff, RetryPolicy, SdkRetry, StatusSet};
