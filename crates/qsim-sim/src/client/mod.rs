//! Client-side models. The state machines live in the I/O-free core
//! (`qsim_core::client`); this module adds what the simulator needs around
//! them: the TOML form of a retry policy.

pub use qsim_core::client::*;

pub mod presets;
pub mod raw;
pub mod trace;
pub use raw::RawRetry;
