//! A replica's prefix cache: KV blocks keyed by block hash, shared by the
//! requests that hold them, kept after they leave in least-recently-freed
//! order inside the replica's KV capacity (vLLM's automatic prefix
//! caching, in units of `unit` tokens: one block hash of the workload,
//! e.g. Mooncake's 512-token blocks, `unit / block_size` KV blocks).
//!
//! Accounting (the replica's `free_blocks` is F):
//! - a unit held by running requests has a reference count ≥ 1 and its
//!   blocks are in use (not in F), counted once however many share it;
//! - a unit nobody holds is *evictable*: it stays cached in free space,
//!   so `evictable × unit_blocks ≤ F` always (the replica trims the cache
//!   after every scheduling step, least recently freed first);
//! - a request's own blocks beyond its shared units are private.
//!
//! A request's full prompt units are looked up when it is admitted: the
//! longest run of leading units present is a hit (capped so that at least
//! one prompt token is computed, as vLLM recomputes the last block of a
//! fully cached prompt); its hit units are shared from then on. When its
//! prompt is computed (first token) its further full units are added to
//! the cache (up to the first one already there, another request's copy),
//! shared by it. When it leaves (or is preempted) its shared units are
//! released. Only full units are cached.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Block hashes are already well spread (or small integers, as in the
/// Mooncake traces): one multiply mixes them.
#[derive(Default)]
pub(crate) struct MixHasher(u64);

impl Hasher for MixHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let h = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 29);
    }
}

/// Lookups by block hash or request id only: never iterated outside the
/// tests' check (eviction order is the LRU list's), so its order cannot
/// reach any output; a fixed hasher keeps even its layout deterministic.
type Map<V> = HashMap<u64, V, BuildHasherDefault<MixHasher>>;

const NIL: u32 = u32::MAX;

struct Node {
    hash: u64,
    refs: u32,
    /// The evictable list (refs == 0), least recently freed first.
    prev: u32,
    next: u32,
}

/// A request's prefix state while it is in the replica.
pub(crate) struct SeqPrefix {
    hashes: Box<[u64]>,
    /// Leading units this request holds a reference to.
    shared: u32,
    /// Prompt tokens served from the cache at its last admission.
    pub(crate) saved: u32,
    /// Counted in the hit statistics (at its first admission).
    counted: bool,
}

/// Counters of a replica's cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Full prompt units offered at first admissions.
    pub units: u64,
    /// Of them, found in the cache (before the last-token cap).
    pub hit_units: u64,
    /// Prompt tokens not prefilled thanks to the cache (every admission).
    pub saved_tokens: u64,
}

pub(crate) struct PrefixCache {
    /// Tokens per unit, and KV blocks per unit.
    pub(crate) unit: u32,
    pub(crate) unit_blocks: u32,
    map: Map<u32>,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    head: u32,
    tail: u32,
    evictable: u32,
    seqs: Map<SeqPrefix>,
    pub(crate) stats: PrefixStats,
}

impl PrefixCache {
    pub(crate) fn new(unit: u32, block_size: u32) -> Self {
        assert!(
            unit > 0 && unit.is_multiple_of(block_size),
            "a unit is whole KV blocks"
        );
        PrefixCache {
            unit,
            unit_blocks: unit / block_size,
            map: Map::default(),
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            head: NIL,
            tail: NIL,
            evictable: 0,
            seqs: Map::default(),
            stats: PrefixStats::default(),
        }
    }

    /// Units cached (held or evictable).
    pub(crate) fn cached_units(&self) -> u32 {
        self.map.len() as u32
    }

    /// KV blocks of the evictable units (in free space).
    pub(crate) fn evictable_blocks(&self) -> u64 {
        self.evictable as u64 * self.unit_blocks as u64
    }

    /// A request enters the replica with its block hashes.
    #[inline(never)]
    pub(crate) fn enter(&mut self, id: u64, hashes: &[u64]) {
        self.seqs.insert(
            id,
            SeqPrefix {
                hashes: hashes.into(),
                shared: 0,
                saved: 0,
                counted: false,
            },
        );
    }

    /// Leading full units of `hashes` (a prompt of `prompt` tokens) cached
    /// here, and the full units in all (the routers' prefix match).
    pub(crate) fn peek(&self, hashes: &[u64], prompt: u32) -> (u64, u64) {
        let full = hashes.len().min((prompt / self.unit) as usize);
        let hit = hashes[..full]
            .iter()
            .take_while(|h| self.map.contains_key(h))
            .count();
        (hit as u64, full as u64)
    }

    /// At admission of request `id` (`prompt` tokens): the units it would
    /// reuse (capped: one prompt token is computed) and the KV blocks
    /// pinning them takes from free space (evictable units).
    #[inline(never)]
    pub(crate) fn lookup(&self, id: u64, prompt: u32) -> (u32, u32) {
        let Some(s) = self.seqs.get(&id) else {
            return (0, 0);
        };
        let (hit, _) = self.peek(&s.hashes, prompt);
        let hit = (hit as u32).min((prompt - 1) / self.unit);
        let pin = s.hashes[..hit as usize]
            .iter()
            .filter(|h| self.nodes[self.map[h] as usize].refs == 0)
            .count() as u32;
        (hit, pin * self.unit_blocks)
    }

    /// Request `id` is admitted with `hit` units from [`lookup`](Self::lookup):
    /// it holds them; counted in the statistics at its first admission.
    #[inline(never)]
    pub(crate) fn admit(&mut self, id: u64, prompt: u32, hit: u32) {
        let Some(s) = self.seqs.get_mut(&id) else {
            return;
        };
        if !s.counted {
            s.counted = true;
            let full = s.hashes.len().min((prompt / self.unit) as usize);
            let matched = s.hashes[..full]
                .iter()
                .take_while(|h| self.map.contains_key(h))
                .count();
            self.stats.units += full as u64;
            self.stats.hit_units += matched as u64;
        }
        s.saved = hit * self.unit;
        self.stats.saved_tokens += s.saved as u64;
        s.shared = hit;
        for u in 0..hit as usize {
            let n = self.map[&s.hashes[u]];
            let node = &mut self.nodes[n as usize];
            if node.refs == 0 {
                unlink(&mut self.nodes, &mut self.head, &mut self.tail, n);
                self.evictable -= 1;
            }
            self.nodes[n as usize].refs += 1;
        }
    }

    /// Request `id`'s prompt is computed: its further full units join the
    /// cache, held by it (up to the first already cached).
    #[inline(never)]
    pub(crate) fn register(&mut self, id: u64, prompt: u32) {
        let Some(s) = self.seqs.get_mut(&id) else {
            return;
        };
        let full = s.hashes.len().min((prompt / self.unit) as usize);
        let mut u = s.shared as usize;
        while u < full {
            let h = s.hashes[u];
            if self.map.contains_key(&h) {
                break;
            }
            let n = match self.free_nodes.pop() {
                Some(n) => {
                    self.nodes[n as usize] = Node {
                        hash: h,
                        refs: 1,
                        prev: NIL,
                        next: NIL,
                    };
                    n
                }
                None => {
                    self.nodes.push(Node {
                        hash: h,
                        refs: 1,
                        prev: NIL,
                        next: NIL,
                    });
                    (self.nodes.len() - 1) as u32
                }
            };
            self.map.insert(h, n);
            u += 1;
        }
        s.shared = u as u32;
    }

    /// Request `id` gives up its blocks (`blocks` in all): the KV blocks
    /// that become free (its private blocks, and its units nobody else
    /// holds, now evictable: most recently freed). `leaving`: it leaves
    /// the replica (else it was preempted and will be admitted again).
    /// Returns (blocks freed, prompt tokens it had from the cache).
    #[inline(never)]
    pub(crate) fn release(&mut self, id: u64, blocks: u32, leaving: bool) -> (u32, u32) {
        let Some(s) = self.seqs.get_mut(&id) else {
            return (blocks, 0);
        };
        let shared = s.shared;
        let saved = s.saved;
        let mut freed = blocks - shared * self.unit_blocks;
        for u in 0..shared as usize {
            let n = self.map[&s.hashes[u]];
            let node = &mut self.nodes[n as usize];
            node.refs -= 1;
            if node.refs == 0 {
                push_back(&mut self.nodes, &mut self.head, &mut self.tail, n);
                self.evictable += 1;
                freed += self.unit_blocks;
            }
        }
        s.shared = 0;
        if leaving {
            self.seqs.remove(&id);
        }
        (freed, saved)
    }

    /// Evict least recently freed units until the evictable ones fit in
    /// `free` blocks.
    #[inline(never)]
    pub(crate) fn fit(&mut self, free: u32) {
        while self.evictable as u64 * self.unit_blocks as u64 > free as u64 {
            let n = self.head;
            debug_assert_ne!(n, NIL);
            unlink(&mut self.nodes, &mut self.head, &mut self.tail, n);
            self.evictable -= 1;
            let h = self.nodes[n as usize].hash;
            self.map.remove(&h);
            self.free_nodes.push(n);
        }
    }

    /// Every held unit's reference count equals the requests holding it,
    /// the evictable list holds exactly the unheld units (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut refs: HashMap<u64, u32> = HashMap::new();
        for s in self.seqs.values() {
            for h in &s.hashes[..s.shared as usize] {
                *refs.entry(*h).or_default() += 1;
            }
        }
        let mut listed = 0;
        let mut n = self.head;
        while n != NIL {
            assert_eq!(self.nodes[n as usize].refs, 0);
            listed += 1;
            n = self.nodes[n as usize].next;
        }
        assert_eq!(listed, self.evictable);
        for (h, &n) in &self.map {
            assert_eq!(
                self.nodes[n as usize].refs,
                refs.get(h).copied().unwrap_or(0)
            );
        }
    }
}

fn unlink(nodes: &mut [Node], head: &mut u32, tail: &mut u32, n: u32) {
    let (p, x) = {
        let node = &nodes[n as usize];
        (node.prev, node.next)
    };
    if p == NIL {
        *head = x;
    } else {
        nodes[p as usize].next = x;
    }
    if x == NIL {
        *tail = p;
    } else {
        nodes[x as usize].prev = p;
    }
    nodes[n as usize].prev = NIL;
    nodes[n as usize].next = NIL;
}

fn push_back(nodes: &mut [Node], head: &mut u32, tail: &mut u32, n: u32) {
    nodes[n as usize].prev = *tail;
    nodes[n as usize].next = NIL;
    if *tail == NIL {
        *head = n;
    } else {
        nodes[*tail as usize].next = n;
    }
    *tail = n;
}
