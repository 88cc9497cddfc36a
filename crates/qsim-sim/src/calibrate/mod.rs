//! Fitting profiles to observations: `hosted` (a hosted API's rate limits
//! and latency from a replay's attempt log).

pub mod hosted;
