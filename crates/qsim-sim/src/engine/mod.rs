//! The deterministic discrete-event engine: virtual time, one event queue,
//! seeded random streams and the distributions drawn from them.

pub mod dist;
pub mod queue;
pub mod rng;
pub mod stats;

pub use dist::{RawDist, Sampler};
pub use queue::{EventQueue, NoDeadlines, Timed};
pub use rng::Rng;
pub use stats::DurationHist;
