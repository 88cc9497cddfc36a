//! Fitting profiles to observations: `hosted` (a hosted API's rate limits
//! and latency from a replay's attempt log) and `server` (a server
//! profile's coefficients from serving benchmarks, with their intervals).

pub mod hosted;
pub mod server;
