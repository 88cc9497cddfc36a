//! The one event queue: a binary heap keyed by (time, insertion sequence).
//!
//! Events at equal times pop in first-in first-out order, which makes every
//! run a deterministic function of its inputs (cf. nexosim's priority queue).

use crate::time::Nanos;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Entry<E> {
    time: Nanos,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.time == other.time && self.seq == other.seq
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    // Reversed: BinaryHeap is a max-heap, we want the earliest (time, seq) first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time
            .cmp(&self.time)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// A future-event list with a virtual clock.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
    now: Nanos,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> EventQueue<E> {
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    pub fn starting_at(now: Nanos) -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
            now,
        }
    }

    pub fn with_capacity(cap: usize) -> Self {
        EventQueue {
            heap: BinaryHeap::with_capacity(cap),
            seq: 0,
            now: 0,
        }
    }

    /// Current virtual time (the time of the last popped event).
    #[inline]
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Schedule `event` at absolute time `time`. Times in the past are clamped
    /// to `now` (an event can never run before the one that scheduled it).
    #[inline]
    pub fn schedule(&mut self, time: Nanos, event: E) {
        let time = time.max(self.now);
        self.heap.push(Entry {
            time,
            seq: self.seq,
            event,
        });
        self.seq += 1;
    }

    /// Schedule `event` `delay` nanoseconds after now.
    #[inline]
    pub fn schedule_in(&mut self, delay: Nanos, event: E) {
        self.schedule(self.now.saturating_add(delay), event);
    }

    /// Pop the earliest event and advance the clock to its time.
    #[inline]
    pub fn pop(&mut self) -> Option<(Nanos, E)> {
        let e = self.heap.pop()?;
        self.now = e.time;
        Some((e.time, e.event))
    }

    /// Time of the next event, if any.
    #[inline]
    pub fn peek_time(&self) -> Option<Nanos> {
        self.heap.peek().map(|e| e.time)
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_time_then_fifo() {
        let mut q = EventQueue::new();
        q.schedule(10, "b1");
        q.schedule(5, "a");
        q.schedule(10, "b2");
        q.schedule(10, "b3");
        q.schedule(7, "c");
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![(5, "a"), (7, "c"), (10, "b1"), (10, "b2"), (10, "b3")]
        );
        assert_eq!(q.now(), 10);
    }

    #[test]
    fn past_is_clamped_to_now() {
        let mut q = EventQueue::new();
        q.schedule(100, 1);
        q.pop();
        q.schedule(50, 2);
        assert_eq!(q.pop(), Some((100, 2)));
    }
}
