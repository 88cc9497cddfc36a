//! What enters and leaves the server model (a leaf: the cluster and its
//! replicas both use it).

use crate::time::Nanos;

/// A request offered to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub input_tokens: u32,
    pub output_tokens: u32,
}

/// A request that left the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub id: u64,
    pub arrival: Nanos,
    pub first_token: Nanos,
    pub finished: Nanos,
    pub output_tokens: u32,
    pub replica: u32,
    /// The request could never run (empty, or longer than `max_model_len`,
    /// or a prompt over `max_batched_tokens` without chunked prefill); it was
    /// answered at once with no output (`first_token == finished == arrival`).
    pub rejected: bool,
    /// Prompt tokens served from the replica's prefix cache (not prefilled)
    /// at its last admission; 0 without prefix caching.
    pub cached_tokens: u32,
}
