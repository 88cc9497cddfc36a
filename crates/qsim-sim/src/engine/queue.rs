//! The one event queue: a binary heap keyed by (time, insertion sequence),
//! and the one event-loop contract every driver uses.
//!
//! Events at equal times pop in first-in first-out order, which makes every
//! run a deterministic function of its inputs (cf. nexosim's priority queue).
//!
//! # The event-loop contract
//!
//! A driver owns one `EventQueue` of its own events (arrivals, sends,
//! replies, snapshots) and one sans-IO component with internal deadlines
//! ([`Timed`]: the server cluster, the managed executor's re-queued rows,
//! the ideal backend). [`EventQueue::next_time`] is the earliest of the two;
//! [`EventQueue::step`] (or `step_while`, with a horizon) runs it, polling
//! the component once:
//!
//! - **at equal times the component's deadline runs first**, then queued
//!   events in insertion order (FIFO); so an event at `t` sees the component
//!   already advanced to `t` with its completions ready to drain;
//! - after every step the driver drains the component's outputs
//!   (completions) before the next step;
//! - the clock never runs backwards: the queue's `now` is the time of the
//!   last step, and events scheduled in the past are clamped to it.
//!
//! ```text
//! while let Some((now, ev)) = q.step_while(&mut component, |t| t <= end) {
//!     if let Some(ev) = ev { handle(now, ev) }
//!     drain(&mut component)
//! }
//! ```

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

/// A sans-IO component with internal deadlines, driven by the event loop.
pub trait Timed {
    /// The component's next internal deadline, if any.
    fn poll_timeout(&self) -> Option<Nanos>;
    /// Run everything due at or before `now`.
    fn handle_timeout(&mut self, now: Nanos);
    /// Run the deadline at `next` and every later one up to `limit`
    /// (≥ `next`), exactly as one [`handle_timeout`](Self::handle_timeout)
    /// per deadline in time order would; return the time of the last one
    /// run. A component whose deadlines are independent of one another
    /// between the driver's events (the server's replicas) runs them without
    /// coming back to the queue. Default: the deadline at `next` only.
    fn handle_through(&mut self, next: Nanos, limit: Nanos) -> Nanos {
        let _ = limit;
        self.handle_timeout(next);
        next
    }
}

/// A component without deadlines (a driver whose only events are its own).
pub struct NoDeadlines;

impl Timed for NoDeadlines {
    fn poll_timeout(&self) -> Option<Nanos> {
        None
    }
    fn handle_timeout(&mut self, _now: Nanos) {}
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

    /// The time of the next step: the earlier of the next queued event and
    /// the component's deadline.
    #[inline]
    pub fn next_time<C: Timed + ?Sized>(&self, c: &C) -> Option<Nanos> {
        match (self.peek_time(), c.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b.max(self.now))),
            (a, b) => a.or(b.map(|b| b.max(self.now))),
        }
    }

    /// Run the next step of the contract: the component's deadline if it is
    /// due no later than the next event (component first at equal times) —
    /// returning `(t, None)` — else pop the next event — `(t, Some(event))`.
    #[inline]
    pub fn step<C: Timed + ?Sized>(&mut self, c: &mut C) -> Option<(Nanos, Option<E>)> {
        self.step_while(c, |_| true)
    }

    /// The time of the next step, whether it is the component's (first at
    /// equal times), and the time of the next queued event.
    #[inline]
    fn next_step<C: Timed + ?Sized>(&self, c: &C) -> Option<(Nanos, bool, Option<Nanos>)> {
        let tq = self.peek_time();
        let tc = c.poll_timeout().map(|t| t.max(self.now));
        let (t, component) = match (tc, tq) {
            (Some(tc), Some(tq)) if tc <= tq => (tc, true),
            (Some(tc), None) => (tc, true),
            (_, Some(tq)) => (tq, false),
            (None, None) => return None,
        };
        Some((t, component, tq))
    }

    /// [`step`](Self::step), if `go(t)` holds for the time `t` of the next
    /// step (a horizon); `None` (and nothing run) otherwise. The component
    /// is polled once per step.
    #[inline]
    pub fn step_while<C: Timed + ?Sized>(
        &mut self,
        c: &mut C,
        go: impl FnOnce(Nanos) -> bool,
    ) -> Option<(Nanos, Option<E>)> {
        let (t, component, _) = self.next_step(c)?;
        if !go(t) {
            return None;
        }
        if component {
            self.now = t;
            c.handle_timeout(t);
            Some((t, None))
        } else {
            self.pop().map(|(t, e)| (t, Some(e)))
        }
    }

    /// [`step_while`](Self::step_while), except that a component step runs
    /// every component deadline up to `limit` and the next queued event
    /// (component first at equal times), through
    /// [`Timed::handle_through`]; it returns the time of the last one, and
    /// the clock moves there. Only for a driver that does nothing between
    /// two component steps but drain outputs whose order it keeps (no
    /// outputs feeding events back), and whose `go` holds up to `limit`.
    #[inline]
    pub fn step_through<C: Timed + ?Sized>(
        &mut self,
        c: &mut C,
        go: impl FnOnce(Nanos) -> bool,
        limit: Nanos,
    ) -> Option<(Nanos, Option<E>)> {
        let (t, component, tq) = self.next_step(c)?;
        if !go(t) {
            return None;
        }
        if component {
            let limit = limit.min(tq.unwrap_or(Nanos::MAX)).max(t);
            let last = c.handle_through(t, limit);
            debug_assert!((t..=limit).contains(&last));
            self.now = last;
            Some((last, None))
        } else {
            self.pop().map(|(t, e)| (t, Some(e)))
        }
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

    struct Deadlines(Vec<Nanos>, Vec<Nanos>);
    impl Timed for Deadlines {
        fn poll_timeout(&self) -> Option<Nanos> {
            self.0.first().copied()
        }
        fn handle_timeout(&mut self, now: Nanos) {
            while self.0.first().is_some_and(|&t| t <= now) {
                self.1.push(self.0.remove(0));
            }
        }
    }

    #[test]
    fn component_first_at_equal_times_then_fifo() {
        let mut q = EventQueue::new();
        let mut c = Deadlines(vec![5, 10], vec![]);
        q.schedule(10, "e1");
        q.schedule(3, "e0");
        q.schedule(10, "e2");
        let mut seen = vec![];
        while let Some(t) = q.next_time(&c) {
            let (now, ev) = q.step(&mut c).unwrap();
            assert_eq!(now, t);
            seen.push((now, ev.unwrap_or("timeout")));
        }
        assert_eq!(
            seen,
            vec![
                (3, "e0"),
                (5, "timeout"),
                (10, "timeout"),
                (10, "e1"),
                (10, "e2")
            ]
        );
        assert_eq!(c.1, vec![5, 10]);
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
