//! Locking that outlives a panic: a holder that panicked does not poison a
//! lock for good (every state behind these locks is valid between
//! statements).

use std::sync::{Mutex, MutexGuard};

/// A lock that a panicking holder did not poison for good.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
